//go:build !linux

package sockstate

import "syscall"

const supported = false

func peerClosed(syscall.Conn) (bool, error) { return false, ErrUnsupported }
