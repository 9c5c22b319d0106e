//go:build unix

package conformance

import (
	"os"
	"os/exec"
	"syscall"
)

// ownProcessGroup makes cmd's process the leader of a process group of its
// own, so that killProcessGroup reaches its children too.
func ownProcessGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// stopProcess stops pid (SIGSTOP).
func stopProcess(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

// continueProcess continues pid (SIGCONT).
func continueProcess(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }

// quitProcess sends p SIGQUIT: a Go program prints every goroutine's stack
// and exits.
func quitProcess(p *os.Process) error { return p.Signal(syscall.SIGQUIT) }

// killProcessGroup kills p's process group (SIGKILL).
func killProcessGroup(p *os.Process) error { return syscall.Kill(-p.Pid, syscall.SIGKILL) }
