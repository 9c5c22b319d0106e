package zookeeper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ZooKeeper wire protocol facts the driver relies on. Every packet, either way,
// is a 4-byte big-endian length and a body. A client request body starts with
// its xid and opcode; a server reply body starts with the xid it answers
// (-1 for a watch event), the zxid and an error code. The first packet of a
// connection is the session handshake instead: ConnectRequest one way,
// ConnectResponse (protocolVersion, timeOut, sessionId, passwd) the other.
const (
	xidPing      = -2
	opMulti      = 14
	opSetWatches = 101
	maxFrame     = 64 << 20 // far above jute.maxbuffer; a bigger length is a broken stream
)

// handshake is what a ConnectResponse told the client.
type handshake struct {
	id      int64
	timeout time.Duration
	passwd  []byte
	sent    time.Time // when the ConnectRequest was written
}

// wireConn is the driver's TCP connection to a server, for connections the
// driver dials itself. It passes every byte through unchanged, and notes three
// things go-zookeeper keeps to itself:
//
//   - the session timeout the server negotiated (it may differ from the one
//     asked for), the session id and its password, from the ConnectResponse;
//   - when each ping was sent, so that its answer proves the server heard
//     from the session at that moment (see session.ack);
//   - for tests, a reply to drop as if the connection had broken after the
//     server applied the request.
//
// It also holds back one thing, to keep go-zookeeper clear of a data race of
// its own (v1.0.4, conn.go): when a connection resumes a session, the
// client's connect loop reads the last zxid it saw, to set its watches again,
// while its receive loop may already be writing that zxid for a reply to a
// request queued during the outage. The first such reply on a resumed
// connection is handed out only after the client wrote its SetWatches
// request (whose zxid it read before), or, if it has no watches to set (it
// then reads nothing), after gateBound.
//
// go-zookeeper writes from one goroutine at a time and reads from one
// goroutine at a time; mu guards what the two sides share.
type wireConn struct {
	net.Conn
	d *Driver

	// Read side.
	frame      []byte // the current frame, handed out from off
	off        int
	handshaken bool
	sessionID  int64
	hold       bool      // a resumed session: the first reply waits for watchesSet
	holdUntil  time.Time // ... or until then

	// Write side.
	whdr []byte // the first 12 bytes of the packet being written
	wrem int    // bytes of the current packet still to come after whdr

	mu          sync.Mutex
	connectSent time.Time
	dropXid     int32         // test hook: reply to drop (0: none)
	watchesSet  chan struct{} // closed when a SetWatches request was written
	setSeen     bool
}

// gateBound is how long the first reply on a resumed connection waits for
// the client's SetWatches request. go-zookeeper reads the zxid for it right
// after the handshake, so the bound only ends the wait of a client that has
// no watches to set.
const gateBound = 100 * time.Millisecond

// dial is the zk.Dialer of connections the driver owns.
func (d *Driver) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	d.wireMu.Lock()
	severed := d.severed
	d.wireMu.Unlock()
	if severed {
		return nil, errSevered
	}
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	wc := &wireConn{Conn: c, d: d, whdr: make([]byte, 0, 12), watchesSet: make(chan struct{})}
	d.wireMu.Lock()
	if d.severed {
		d.wireMu.Unlock()
		_ = c.Close()
		return nil, errSevered
	}
	d.wire = wc
	d.wireMu.Unlock()
	return wc, nil
}

var errSevered = errors.New("connection severed (test hook)")

// Read implements net.Conn. It reads the server's stream one whole frame at a
// time, inspects the frame, and hands it out.
func (c *wireConn) Read(p []byte) (int, error) {
	if c.off == len(c.frame) {
		if err := c.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.frame[c.off:])
	c.off += n
	return n, nil
}

func (c *wireConn) next() error {
	var hdr [4]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return fmt.Errorf("zookeeper: a reply of %d bytes: the stream is broken", n)
	}
	size := 4 + int(n)
	if cap(c.frame) < size || cap(c.frame) > 1<<20 && size < 1<<16 {
		c.frame = make([]byte, size)
	}
	c.frame = c.frame[:size]
	copy(c.frame, hdr[:])
	if _, err := io.ReadFull(c.Conn, c.frame[4:]); err != nil {
		return err
	}
	c.off = 0
	return c.inspect(c.frame[4:])
}

func (c *wireConn) inspect(body []byte) error {
	if !c.handshaken {
		c.handshaken = true
		// ConnectResponse: protocolVersion int32, timeOut int32, sessionId
		// int64, passwd buffer. A zero session id means the session expired.
		if len(body) < 20 {
			return nil
		}
		timeout := time.Duration(int32(binary.BigEndian.Uint32(body[4:8]))) * time.Millisecond
		id := int64(binary.BigEndian.Uint64(body[8:16]))
		plen := int(int32(binary.BigEndian.Uint32(body[16:20])))
		if id == 0 || timeout <= 0 || plen < 0 || 20+plen > len(body) {
			return nil
		}
		c.sessionID = id
		if c.d.lastHandshake().id == id {
			c.hold, c.holdUntil = true, time.Now().Add(gateBound)
		}
		c.mu.Lock()
		sent := c.connectSent
		c.mu.Unlock()
		c.d.setHandshake(handshake{id: id, timeout: timeout, passwd: append([]byte(nil), body[20:20+plen]...), sent: sent})
		return nil
	}
	if len(body) < 4 {
		return nil
	}
	xid := int32(binary.BigEndian.Uint32(body[0:4]))
	if c.hold && xid >= 0 && len(body) >= 12 && int64(binary.BigEndian.Uint64(body[4:12])) > 0 {
		c.hold = false
		t := time.NewTimer(time.Until(c.holdUntil))
		select {
		case <-c.watchesSet:
		case <-t.C:
		}
		t.Stop()
	}
	// A ping's reply is not taken as proof that the session is alive: a
	// follower cut off from the leader answers pings (for up to syncLimit
	// ticks) while the leader may already be counting the session down. Only
	// requests the leader confirmed (writes, sync) move the session's lastAck.
	c.mu.Lock()
	drop := c.dropXid != 0 && xid == c.dropXid
	if drop {
		c.dropXid = 0
	}
	c.mu.Unlock()
	if drop {
		c.frame, c.off = c.frame[:0], 0
		_ = c.Conn.Close()
		return errDropped
	}
	return nil
}

var errDropped = errors.New("reply dropped (test hook)")

// Write implements net.Conn. It notes the start of every packet in p before
// writing it, so a recorded send time is never later than the real one.
func (c *wireConn) Write(p []byte) (int, error) {
	now := time.Now()
	broken := false
	c.mu.Lock()
	for q := p; len(q) > 0; {
		if c.wrem > 0 {
			skip := min(c.wrem, len(q))
			c.wrem -= skip
			q = q[skip:]
			continue
		}
		take := min(12-len(c.whdr), len(q))
		c.whdr = append(c.whdr, q[:take]...)
		q = q[take:]
		if len(c.whdr) < 12 {
			break
		}
		// Every packet is at least 12 bytes: the length, then an xid and an
		// opcode (or, for the ConnectRequest, 40 bytes and more).
		c.wrem = max(4+int(binary.BigEndian.Uint32(c.whdr[0:4]))-12, 0)
		if c.connectSent.IsZero() {
			c.connectSent = now
		} else {
			xid := int32(binary.BigEndian.Uint32(c.whdr[4:8]))
			op := int32(binary.BigEndian.Uint32(c.whdr[8:12]))
			if xid != xidPing {
				drop, brk := c.d.takeHooks(op)
				if drop {
					c.dropXid = xid
				}
				broken = broken || brk
			}
			if op == opSetWatches && !c.setSeen {
				c.setSeen = true
				close(c.watchesSet)
			}
		}
		c.whdr = c.whdr[:0]
	}
	c.mu.Unlock()
	if broken {
		_ = c.Conn.Close()
	}
	return c.Conn.Write(p)
}

// setHandshake records the latest ConnectResponse, which the StateHasSession
// event that follows it (on the same goroutine) picks up.
func (d *Driver) setHandshake(h handshake) {
	d.wireMu.Lock()
	d.handshake = h
	d.wireMu.Unlock()
}

func (d *Driver) lastHandshake() handshake {
	d.wireMu.Lock()
	defer d.wireMu.Unlock()
	return d.handshake
}

// takeHooks reports whether the reply to a request with opcode op is to be
// dropped, and whether the connection is to break as it is written (test
// hooks; see export_test.go), and disarms the hook that fired. It also
// records op while the recording hook is on.
func (d *Driver) takeHooks(op int32) (drop, brk bool) {
	d.wireMu.Lock()
	defer d.wireMu.Unlock()
	if d.recordOps {
		d.sentOps = append(d.sentOps, op)
	}
	if d.dropOp != 0 && d.dropOp == op {
		d.dropOp = 0
		drop = true
	}
	if d.breakOp != 0 && d.breakOp == op {
		d.breakOp = 0
		brk = true
	}
	return drop, brk
}
