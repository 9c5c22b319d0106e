//go:build linux

package sockstate

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const supported = true

// tcpEstablished is the kernel's TCP_ESTABLISHED (include/net/tcp_states.h).
// A client connection leaves it for CLOSE_WAIT when the peer's FIN arrives
// and for CLOSE on a reset; it leaves it itself only when it closes.
const tcpEstablished = 1

func peerClosed(c syscall.Conn) (bool, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return false, err
	}
	if serr != nil {
		return false, serr
	}
	return info.State != tcpEstablished, nil
}
