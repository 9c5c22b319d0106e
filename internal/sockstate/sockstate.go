// Package sockstate tells whether the peer of an idle TCP connection has
// closed it, without reading from it: a driver whose lock lives as long as a
// server session learns of the session's end the moment the server closes
// the connection, while nothing reads from it.
package sockstate

import (
	"errors"
	"syscall"
)

// ErrUnsupported is returned where the platform cannot tell.
var ErrUnsupported = errors.New("sockstate: not supported on this platform")

// Supported reports whether PeerClosed can tell on this platform.
const Supported = supported

// PeerClosed reports whether c's peer has closed the connection or reset
// it: a FIN or an RST has arrived. It reads nothing, so bytes that arrived
// before the FIN stay for the connection's reader; and it answers false for
// a peer that is silent or unreachable (no FIN came).
func PeerClosed(c syscall.Conn) (bool, error) {
	return peerClosed(c)
}
