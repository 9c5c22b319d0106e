//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// forwardSignals are the signals dlock run passes on to the command.
var forwardSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// prepareChild makes cmd start in a process group of its own, so that a
// lost lease stops everything the command started, and so that a signal
// dlock forwards reaches its whole group, as one from a terminal would. If
// dlock is in the foreground of a terminal on its standard input, the new
// group gets the terminal, and prepareChild reports true. On Linux the
// command also gets SIGKILL if dlock dies.
func prepareChild(cmd *exec.Cmd) (foreground bool) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if pgrp, err := tcgetpgrp(0); err == nil && pgrp == syscall.Getpgrp() {
		foreground = true
		attr.Foreground = true
		attr.Ctty = 0 // the command's standard input, which is dlock's
	}
	setParentDeathSignal(attr)
	cmd.SysProcAttr = attr
	return foreground
}

// started runs once the command has started.
func (c *child) started() {
	if c.fg {
		// dlock is now in a background group of the terminal: keep its
		// messages from stopping it (stty tostop), and let restoreTerminal
		// take the terminal back. Not before the start: an ignored signal
		// stays ignored in the command.
		signal.Ignore(syscall.SIGTTOU)
	}
}

// restoreTerminal gives the terminal back to dlock's process group if the
// command had it.
func (c *child) restoreTerminal() {
	if !c.fg {
		return
	}
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, syscall.Getpgrp())
	signal.Reset(syscall.SIGTTOU)
}

// forward sends sig to the command's process group.
func (c *child) forward(sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(-c.cmd.Process.Pid, s)
	}
}

// stop sends SIGTERM, or SIGKILL if force is set, to the command's process
// group.
func (c *child) stop(force bool) {
	if force {
		c.forward(syscall.SIGKILL)
	} else {
		c.forward(syscall.SIGTERM)
	}
}

// groupAlive reports whether any process is left in the command's process
// group.
func (c *child) groupAlive() bool {
	return !errors.Is(syscall.Kill(-c.cmd.Process.Pid, 0), syscall.ESRCH)
}

// exitStatus is the status a shell would report for the command: its exit
// code, or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return ps.ExitCode()
}

// signalNumber returns sig's number.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// signalName returns sig's name, such as "SIGTERM".
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}
