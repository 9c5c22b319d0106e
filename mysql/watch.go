// Loss notification: the end of a lease's session, read off its idle
// connection.

package mysql

import (
	"context"
	"database/sql/driver"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/sockstate"
)

// lossPoll is how often the watcher looks at the connections of the held
// leases: a lease whose session the server ended (KILL, a restart, the
// connection cut) ends within about this long, without a renewal.
const lossPoll = 50 * time.Millisecond

// registry pairs each connection of a pool the driver opened with the socket
// it was dialed over, by the driver connection (what sql.Conn.Raw gives), so
// that a lease watches its own socket: never one found by session id, which
// a restarted server gives out again, and another server does on its own.
type registry struct {
	mu    sync.Mutex
	socks map[any]*sock // by driver.Conn
}

func newRegistry() *registry { return &registry{socks: make(map[any]*sock)} }

// sock is a socket the driver dialed for its pool.
type sock struct {
	*net.TCPConn
	r      *registry
	closed atomic.Bool // go-sql-driver closed it
	dc     any         // its driver connection, once Connect returned (under r.mu)
}

// Close may come from another goroutine than the connection's reader
// (go-sql-driver closes a connection whose ctx was cancelled).
func (s *sock) Close() error {
	s.r.mu.Lock()
	s.closed.Store(true)
	if s.dc != nil {
		delete(s.r.socks, s.dc)
	}
	s.r.mu.Unlock()
	return s.TCPConn.Close()
}

// dialSlot carries the socket dial made from Connect's call to the inner
// connector (in its ctx) back to Connect.
type dialSlot struct{ s *sock }

type dialSlotKey struct{}

// dial is the go-sql-driver/mysql DialFunc of the pools the driver opens.
func (r *registry) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tcp, ok := c.(*net.TCPConn)
	slot, _ := ctx.Value(dialSlotKey{}).(*dialSlot)
	if !ok || slot == nil {
		return c, nil
	}
	slot.s = &sock{TCPConn: tcp, r: r}
	return slot.s, nil
}

// connector is the driver.Connector of the pools the driver opens: it
// registers each connection with the socket dial made for it.
type connector struct {
	driver.Connector
	r *registry
}

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	slot := new(dialSlot)
	dc, err := c.Connector.Connect(context.WithValue(ctx, dialSlotKey{}, slot))
	if err != nil || slot.s == nil {
		return dc, err
	}
	c.r.mu.Lock()
	if !slot.s.closed.Load() {
		slot.s.dc = dc
		c.r.socks[dc] = slot.s
	}
	c.r.mu.Unlock()
	return dc, nil
}

// sock returns the socket of the driver connection dc (from sql.Conn.Raw),
// nil if the registry does not know it.
func (r *registry) sock(dc any) *sock {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.socks[dc]
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

// unwatch stops following h's connection, and reports whether it followed
// it.
func (d *Driver) unwatch(h *held) bool {
	d.watcher.mu.Lock()
	defer d.watcher.mu.Unlock()
	_, ok := d.watcher.leases[h]
	delete(d.watcher.leases, h)
	return ok
}

// watchHook, if set, is called at the start of each round of a watcher
// (tests).
var watchHook atomic.Pointer[func()]

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
		if f := watchHook.Load(); f != nil {
			(*f)()
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
			// Not for a lease whose Release began since the snapshot.
			if cause := check(h); cause != nil && d.unwatch(h) {
				h.onLost(cause)
			}
		}
	}
}

// check returns why h's session has ended, or nil if it has not, as far as
// its socket tells. It reads only the socket's state and takes no lock of
// h's: a renewal stuck in its statement holds h.mu, and delays no check.
func check(h *held) error {
	s := h.cs.sock
	if s.closed.Load() {
		return fmt.Errorf("%w: the connection of the lock's session %d was closed", backend.ErrNotHeld, h.cs.id)
	}
	closed, err := sockstate.PeerClosed(s.TCPConn)
	if err != nil || !closed {
		return nil
	}
	return fmt.Errorf("%w: the server closed the lock's session %d", backend.ErrNotHeld, h.cs.id)
}
