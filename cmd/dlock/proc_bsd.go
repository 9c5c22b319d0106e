//go:build unix && !linux

package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setParentDeathSignal does nothing: only Linux has a parent-death signal
// that dlock can set through os/exec.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// tcgetpgrp returns the foreground process group of the terminal fd.
func tcgetpgrp(fd int) (int, error) {
	return unix.IoctlGetInt(fd, unix.TIOCGPGRP)
}
