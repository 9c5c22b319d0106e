//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// forwardSignals are the signals dlock run passes on to the command.
var forwardSignals = []os.Signal{os.Interrupt}

// prepareChild does nothing: without Unix process groups the command runs
// as an ordinary child.
func prepareChild(*exec.Cmd) (foreground bool) { return false }

func (c *child) started()         {}
func (c *child) restoreTerminal() {}

// forward passes sig on to the command, where the system supports it.
func (c *child) forward(sig os.Signal) { _ = c.cmd.Process.Signal(sig) }

// stop kills the command: there is no gentler way here.
func (c *child) stop(bool) { _ = c.cmd.Process.Kill() }

// groupAlive reports false: the command's own exit is all dlock can see.
func (c *child) groupAlive() bool { return false }

// exitStatus returns the command's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }

func signalNumber(os.Signal) int { return 2 }

func signalName(sig os.Signal) string { return sig.String() }
