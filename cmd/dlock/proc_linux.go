package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setParentDeathSignal makes the kernel send the command SIGKILL if dlock
// dies: without dlock nothing renews the lease, so the command must not
// outlive it.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}

// tcgetpgrp returns the foreground process group of the terminal fd.
func tcgetpgrp(fd int) (int, error) {
	pgrp, err := unix.IoctlGetUint32(fd, unix.TIOCGPGRP)
	return int(pgrp), err
}
