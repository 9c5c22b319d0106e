package sockstate_test

import (
	"net"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/sockstate"
)

// pair returns the two ends of a loopback TCP connection, closed when t
// ends; it skips t where PeerClosed is not supported.
func pair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	if !sockstate.Supported {
		t.Skip("not supported on this platform")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, ok := (<-accepted).(*net.TCPConn)
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = s.Close() })
	return c.(*net.TCPConn), s
}

// TestPeerClosed: an open connection is not closed, with or without unread
// bytes; one whose peer closed it is, and the bytes sent before the close
// are still there to read.
func TestPeerClosed(t *testing.T) {
	c, server := pair(t)
	check := func(want bool, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := sockstate.PeerClosed(c)
			if err != nil {
				t.Fatal(err)
			}
			if got == want {
				return
			}
			if !want || time.Now().After(deadline) {
				t.Fatalf("%s: PeerClosed = %v, want %v", what, got, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	check(false, "open, idle")
	if _, err := server.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	// (No signal says the bytes have arrived without reading them; on
	// loopback they take microseconds.)
	time.Sleep(10 * time.Millisecond)
	check(false, "open, bytes unread")
	_ = server.Close()
	check(true, "closed by the peer")
	buf := make([]byte, 2)
	if n, err := c.Read(buf); n != 2 || string(buf) != "hi" {
		t.Fatalf("the bytes sent before the close: %q, %v", buf[:n], err)
	}
}

// TestPeerReset: a reset (the peer closed with unread data, or SO_LINGER 0)
// counts as closed.
func TestPeerReset(t *testing.T) {
	c, server := pair(t)
	_ = server.SetLinger(0)
	_ = server.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		closed, err := sockstate.PeerClosed(c)
		if err != nil {
			t.Fatal(err)
		}
		if closed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("PeerClosed = false 5s after a reset")
		}
		time.Sleep(time.Millisecond)
	}
}
