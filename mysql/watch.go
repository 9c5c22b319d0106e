// Loss notification: the end of a lease's session, read off its idle
// connection.

package mysql

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/sockstate"
)

// lossPoll is how often the watcher looks at the connections of the held
// leases: a lease whose session the server ended (KILL, a restart, the
// connection cut) ends within about this long, without a renewal.
const lossPoll = 50 * time.Millisecond

// registry holds the connections a driver opened from a DSN dialed, by the
// id of the session the server announced in its greeting (the low 32 bits
// of CONNECTION_ID()).
type registry struct {
	mu    sync.Mutex
	conns map[uint32]*net.TCPConn
}

func newRegistry() *registry { return &registry{conns: make(map[uint32]*net.TCPConn)} }

// dial is the go-sql-driver/mysql DialFunc of the pools the driver opens.
func (r *registry) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	return &greetConn{TCPConn: tcp, r: r}, nil
}

func (r *registry) get(id int64) *net.TCPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns[uint32(id)]
}

// greetConn is a connection that reads the session id from the server's
// greeting (the first packet: a 4-byte header, the protocol version, the
// server version ending in NUL, then the id, 4 bytes little-endian) and
// passes every byte through.
type greetConn struct {
	*net.TCPConn
	r    *registry
	head []byte // the greeting so far; nil once read (Read's goroutine)
	done bool   // (Read's goroutine)
	id   uint32 // the session's id, 0 until read (under r.mu)
}

func (c *greetConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	if !c.done && n > 0 {
		c.head = append(c.head, p[:n]...)
		c.parse()
	}
	return n, err
}

func (c *greetConn) parse() {
	b := c.head
	if len(b) < 5 {
		return
	}
	for i := 5; i < len(b); i++ {
		if b[i] != 0 {
			continue
		}
		if len(b) < i+5 {
			return
		}
		id := uint32(b[i+1]) | uint32(b[i+2])<<8 | uint32(b[i+3])<<16 | uint32(b[i+4])<<24
		c.done, c.head = true, nil
		c.r.mu.Lock()
		c.id = id
		c.r.conns[id] = c.TCPConn
		c.r.mu.Unlock()
		return
	}
	if len(b) > 512 { // not a greeting this driver knows: give up
		c.done, c.head = true, nil
	}
}

// Close may come from another goroutine than Read's (go-sql-driver closes a
// connection whose ctx was cancelled): id is shared under the registry's
// lock.
func (c *greetConn) Close() error {
	c.r.mu.Lock()
	if c.id != 0 && c.r.conns[c.id] == c.TCPConn {
		delete(c.r.conns, c.id)
	}
	c.r.mu.Unlock()
	return c.TCPConn.Close()
}

// watcher follows the connections of the held leases, for a driver that
// dialed them (see Capabilities' LossNotify). One goroutine serves every
// lease; it runs while any lease is watched.
type watcher struct {
	mu      sync.Mutex
	leases  map[*held]struct{}
	running bool
}

// watch starts following h's connection.
func (d *Driver) watch(h *held) {
	w := &d.watcher
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.leases == nil {
		w.leases = make(map[*held]struct{})
	}
	w.leases[h] = struct{}{}
	if !w.running {
		// Not once Close has begun to wait for the watcher (see Close).
		d.callMu.RLock()
		if !d.closed.Load() {
			w.running = true
			d.wg.Go(d.watchLoop)
		}
		d.callMu.RUnlock()
	}
}

// unwatch stops following h's connection.
func (d *Driver) unwatch(h *held) {
	d.watcher.mu.Lock()
	delete(d.watcher.leases, h)
	d.watcher.mu.Unlock()
}

func (d *Driver) watchLoop() {
	t := time.NewTicker(lossPoll)
	defer t.Stop()
	for {
		select {
		case <-d.quit.Done():
			d.watcher.mu.Lock()
			d.watcher.running = false
			d.watcher.mu.Unlock()
			return
		case <-t.C:
		}
		w := &d.watcher
		w.mu.Lock()
		if len(w.leases) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		hs := make([]*held, 0, len(w.leases))
		for h := range w.leases {
			hs = append(hs, h)
		}
		w.mu.Unlock()
		for _, h := range hs {
			if cause := d.check(h); cause != nil {
				d.unwatch(h)
				h.onLost(cause)
			}
		}
	}
}

// check returns why h's session has ended, or nil if it has not, as far as
// its connection tells.
func (d *Driver) check(h *held) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	c := d.reg.get(h.cs.id)
	if c == nil {
		return fmt.Errorf("%w: the connection of the lock's session %d was closed", backend.ErrNotHeld, h.cs.id)
	}
	closed, err := sockstate.PeerClosed(c)
	if err != nil || !closed {
		return nil
	}
	return fmt.Errorf("%w: the server closed the lock's session %d", backend.ErrNotHeld, h.cs.id)
}
