// Following locks as they change (backend.Watcher): LISTEN/NOTIFY.

package postgres

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Watcher = (*Driver)(nil)

// NotifyChannel is the channel on which the driver NOTIFYs the grants, label
// changes and releases of leases acquired with dlock.WithAnnounce, and its
// breaks, with AdvisoryKey.Payload; a session's end is not announced.
const NotifyChannel = "dlock_lock_changed"

// Payload returns the NOTIFY payload that names k on NotifyChannel: the
// pg_locks columns classid, objid and objsubid of the lock, joined by ":".
func (k AdvisoryKey) Payload() string {
	classid, objid, objsubid := k.PgLocks()
	return strconv.FormatUint(uint64(classid), 10) + ":" + strconv.FormatUint(uint64(objid), 10) + ":" + strconv.Itoa(int(objsubid))
}

// notifySQL announces a change of the lock named by $1.
const notifySQL = "SELECT pg_notify('" + NotifyChannel + "', $1)"

// notifyOn announces a change of key's lock on conn, bounded by
// cleanupTimeout whatever ctx says (cancelling a statement would break the
// connection, which may hold locks). It reports whether the announcement
// was sent.
func notifyOn(ctx context.Context, conn *pgx.Conn, key AdvisoryKey) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, notifySQL, key.Payload())
	return err
}

// listener is the driver's one LISTEN connection, serving every Watch; it
// runs while any watch does.
type listener struct {
	d *Driver

	mu      sync.Mutex
	watches map[string]map[*watch]struct{} // by payload
	n       int                            // watches registered
	run     *listenRun                     // the running LISTEN loop; nil when none
}

// watch is one Watch call.
type watch struct {
	payload string
	changed func()
}

// listenRun is one run of the LISTEN loop: it ends when its ctx is
// cancelled (no watch left, or Close).
type listenRun struct {
	cancel context.CancelFunc
	ready  chan struct{} // closed after the first try to LISTEN
	first  error         // that try's error; set before ready is closed
}

// Watch implements backend.Watcher with LISTEN on NotifyChannel, on one
// connection outside the pool shared by every Watch; it reports what
// NotifyChannel carries, and each break and return of that connection.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	w := &watch{payload: d.opts.AdvisoryKey(key).Payload(), changed: changed}
	l := &d.listen
	l.mu.Lock()
	if l.watches == nil {
		l.watches = map[string]map[*watch]struct{}{}
	}
	if l.watches[w.payload] == nil {
		l.watches[w.payload] = map[*watch]struct{}{}
	}
	l.watches[w.payload][w] = struct{}{}
	l.n++
	run := l.run
	if run == nil {
		run = l.start()
	}
	l.mu.Unlock()
	stop := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, ok := l.watches[w.payload][w]; !ok {
			return
		}
		delete(l.watches[w.payload], w)
		if len(l.watches[w.payload]) == 0 {
			delete(l.watches, w.payload)
		}
		if l.n--; l.n == 0 && l.run != nil {
			l.run.cancel()
			l.run = nil
		}
	}
	select {
	case <-run.ready:
	case <-ctx.Done():
		stop()
		return ctx.Err()
	case <-d.quit.Done():
		stop()
		return errClosed
	}
	if run.first != nil {
		stop()
		return fmt.Errorf("listen: %w", run.first)
	}
	context.AfterFunc(ctx, stop)
	return nil
}

// start starts a LISTEN loop; l.mu must be held.
func (l *listener) start() *listenRun {
	ctx, cancel := context.WithCancel(context.Background())
	run := &listenRun{cancel: cancel, ready: make(chan struct{})}
	l.run = run
	d := l.d
	d.closing.Add(1)
	go func() { // owned by the driver: ends when no watch is left, or at Close
		defer d.closing.Done()
		defer cancel()
		stopOnClose := context.AfterFunc(d.quit, cancel)
		defer stopOnClose()
		l.loop(ctx, run)
	}()
	return run
}

// loop connects, LISTENs and dispatches notifications until ctx ends,
// connecting again (with a backoff) when the connection breaks.
func (l *listener) loop(ctx context.Context, run *listenRun) {
	backoff := backend.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	readied := false
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.d.pool.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
				_ = conn.Close(context.Background())
			}
		}
		if err != nil {
			if !readied {
				// The Watch calls waiting for this run fail; later ones
				// start another.
				l.mu.Lock()
				if l.run == run {
					l.run = nil
				}
				l.mu.Unlock()
				run.first = err
				close(run.ready)
				return
			}
			if backend.Sleep(ctx, backoff.Next()) != nil {
				break
			}
			continue
		}
		backoff.Reset()
		if !readied {
			close(run.ready)
			readied = true
		} else {
			l.all() // listening again: changes may have been missed
		}
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				break
			}
			l.dispatch(n.Payload)
		}
		_ = conn.Close(context.Background())
		if ctx.Err() == nil {
			l.all() // not listening: something may change unseen
		}
	}
	if !readied {
		run.first = ctx.Err()
		close(run.ready)
	}
}

// dispatch calls the watches of payload.
func (l *listener) dispatch(payload string) {
	l.mu.Lock()
	ws := make([]*watch, 0, len(l.watches[payload]))
	for w := range l.watches[payload] {
		ws = append(ws, w)
	}
	l.mu.Unlock()
	for _, w := range ws {
		w.changed()
	}
}

// all calls every watch.
func (l *listener) all() {
	l.mu.Lock()
	var ws []*watch
	for _, set := range l.watches {
		for w := range set {
			ws = append(ws, w)
		}
	}
	l.mu.Unlock()
	for _, w := range ws {
		w.changed()
	}
}
