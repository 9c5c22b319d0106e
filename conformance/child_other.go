//go:build !unix

package conformance

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// ownProcessGroup does nothing where there are no process groups.
func ownProcessGroup(*exec.Cmd) {}

// stopProcess fails: only Unix can stop a process and continue it, so the
// cases that pause a holder fail here.
func stopProcess(int) error {
	return fmt.Errorf("pausing a process (SIGSTOP): %w", errors.ErrUnsupported)
}

// continueProcess fails, as stopProcess does.
func continueProcess(int) error {
	return fmt.Errorf("continuing a process (SIGCONT): %w", errors.ErrUnsupported)
}

// quitProcess kills p: there is no SIGQUIT to ask for its stacks.
func quitProcess(p *os.Process) error { return p.Kill() }

// killProcessGroup kills p.
func killProcessGroup(p *os.Process) error { return p.Kill() }
