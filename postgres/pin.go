package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/backend"
)

// pin is one lease's connection: the session that holds its advisory lock.
// A pgx connection is not safe for concurrent use, so every use of it —
// refresh, release, the idle watcher — happens while holding mu, a one-slot
// semaphore (so that waiting for it can respect a ctx).
type pin struct {
	d     *Driver
	key   AdvisoryKey
	share bool   // the lock is held shared (AcquireRequest.Shared); set before the acquire
	pid   uint32 // pg_backend_pid() of the session that took the lock

	lost     chan struct{} // closed when the session is known gone or given up
	lostOnce sync.Once
	onLost   func() // called once lost is closed: dlock's OnLost, or a shared session's leases end

	mu chan struct{} // holds one token while the connection is in use

	// abandoned is set by a release that gave up waiting for mu (its ctx
	// ended behind a slow refresh): nobody will release the lease again, so
	// whoever holds mu next destroys the connection as it unlocks. Set
	// before the releaser's last try for mu, read under mu: one of the two
	// always sees the other, and the connection is given up exactly once.
	abandoned atomic.Bool

	// announce: the lease was acquired with dlock.WithAnnounce; its release
	// is announced (watch.go). Set before the grant is returned.
	announce bool

	// Test hook: called by refresh with mu held, before the ping.
	refreshing func()

	// watchArmed is set while watchTimer is armed (see startWatchLater).
	watchArmed atomic.Bool

	// Guarded by mu.
	pc         *pgxpool.Conn // nil once released to the pool or closed
	watch      chan error    // result of the idle watcher; nil when none runs
	watchTimer *time.Timer   // starts the idle watcher; made on first use, then reset
	watchDue   time.Time     // when the idle watcher should start
	hotUntil   time.Time     // the deadline hot set on the connection; zero when none is set
}

// watchDelay is how long a new lease goes before its idle watcher starts: a
// lease released sooner (a short critical section) never pays for one, and a
// session that ends in that time is noticed that much later.
const watchDelay = 20 * time.Millisecond

func newPin(d *Driver, pc *pgxpool.Conn, key AdvisoryKey, share bool) *pin {
	return &pin{d: d, pc: pc, key: key, share: share, lost: make(chan struct{}), mu: make(chan struct{}, 1)}
}

// lock takes mu, or gives up when ctx ends.
func (p *pin) lock(ctx context.Context) error {
	select {
	case p.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlock gives mu back; if the lease was abandoned meanwhile, it first gives
// the connection up (closing it ends the session and frees the lock).
func (p *pin) unlock() {
	if p.abandoned.Load() && p.pc != nil {
		p.destroy()
	}
	<-p.mu
}

// abandon is what a release does when its ctx ends before it gets mu: it
// leaves the connection to the holder of mu, or takes mu itself if it came
// free, so that the connection is destroyed exactly once whatever the
// interleaving.
func (p *pin) abandon() {
	p.abandoned.Store(true)
	select {
	case p.mu <- struct{}{}:
		p.unlock()
	default: // busy: its holder sees abandoned when it unlocks
	}
}

func (p *pin) markLost() {
	p.lostOnce.Do(func() {
		close(p.lost)
		if p.onLost != nil {
			p.onLost()
		}
	})
}

// startWatch reads the idle connection in the background, so that the end of
// the session (the server sends a FATAL error and closes it) is noticed at
// once: it closes lost. mu must be held; stopWatch must be called before the
// connection is used again.
func (p *pin) startWatch() {
	p.cool() // the watcher's read waits as long as the session is idle
	pg := p.pc.Conn().PgConn()
	done := make(chan error, 1)
	p.watch = done
	go func() {
		for {
			// With the background context, pgx sets no deadline of its own:
			// stopWatch interrupts the read with one.
			err := pg.WaitForNotification(context.Background())
			if err == nil {
				continue // a NOTIFY on a channel someone else's code LISTENs to
			}
			if !isTimeout(err) {
				p.markLost()
			}
			done <- err
			return
		}
	}()
}

// startWatchLater starts the idle watcher after watchDelay, unless the
// connection is in use then (its user restarts the watcher) or gone. mu must
// be held.
//
// One timer per pin serves every call: while it is armed, a call only moves
// the watcher's start (watchDue), and the timer, when it fires early, is armed
// again for the rest. A connection used again and again (an acquire and a
// release every few hundred µs) thus arms a timer once per watchDelay, not
// once per use: arming one that fires before anything else the runtime waits
// for wakes its network poller, a syscall each time.
func (p *pin) startWatchLater() {
	p.watchDue = time.Now().Add(watchDelay)
	if !p.watchArmed.CompareAndSwap(false, true) {
		return // armed: it fires by watchDue, and looks again
	}
	if p.watchTimer == nil {
		p.watchTimer = time.AfterFunc(watchDelay, p.watchTimerFired)
	} else {
		p.watchTimer.Reset(watchDelay)
	}
}

// watchTimerFired is watchTimer's function: it starts the idle watcher if
// the connection has been idle until watchDue, or arms the timer for the
// rest of the time.
func (p *pin) watchTimerFired() {
	// Disarmed before mu is tried: a user that holds mu now arms the timer
	// again when it is done.
	p.watchArmed.Store(false)
	select {
	case p.mu <- struct{}{}:
	default:
		return // busy: its user calls startWatchLater when it is done
	}
	defer p.unlock()
	if p.pc == nil || p.watch != nil {
		return
	}
	if rest := time.Until(p.watchDue); rest > 0 {
		if p.watchArmed.CompareAndSwap(false, true) {
			p.watchTimer.Reset(rest)
		}
		return
	}
	p.startWatch()
}

// stopWatchTimer disarms watchTimer for good: the connection leaves the pin.
// mu must be held.
func (p *pin) stopWatchTimer() {
	if p.watchTimer != nil {
		p.watchTimer.Stop()
	}
}

// stopWatch ends the idle watcher and reports the error that ended the
// session, if it ended. mu must be held.
func (p *pin) stopWatch() error {
	// The timer stays armed (see startWatchLater): when it fires, it finds
	// the connection in use, or starts the watcher only once watchDue has
	// come.
	if p.watch == nil {
		return nil
	}
	nc := p.pc.Conn().PgConn().Conn()
	_ = nc.SetReadDeadline(time.Unix(1, 0))
	err := <-p.watch
	p.watch = nil
	_ = nc.SetReadDeadline(time.Time{})
	if isTimeout(err) {
		return nil
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// destroy gives the connection up: it closes lost, takes the connection out
// of the pool and closes it, which ends the session and frees its lock on the
// server. mu must be held.
func (p *pin) destroy() {
	if p.pc == nil {
		return
	}
	_ = p.stopWatch()
	p.cool() // closing says goodbye to the server, if it can
	p.stopWatchTimer()
	p.markLost()
	conn := p.pc.Hijack()
	p.pc = nil
	p.d.untrack(p)
	p.d.closeConn(conn)
}

// giveBack returns the connection to the pool: only for a session that holds
// no lock and has its settings as the pool gave them. mu must be held.
func (p *pin) giveBack() {
	p.cool()
	p.stopWatchTimer()
	p.d.untrack(p)
	p.pc.Release()
	p.pc = nil
}

// usable reports why the pin's session can no longer serve the lease: the
// lease was released, or its connection closed, or the session ended while
// idle. mu must be held; it stops the watcher, and clears the deadline hot
// set: the statements that follow are bounded by their ctx.
func (p *pin) usable() error {
	if err := p.ready(); err != nil {
		return err
	}
	p.cool()
	return nil
}

// ready is usable for a statement bounded by hot: it leaves hot's deadline
// on the connection.
func (p *pin) ready() error {
	if p.pc == nil {
		return fmt.Errorf("%w: the lease's connection is closed", backend.ErrNotHeld)
	}
	if err := p.stopWatch(); err != nil {
		p.destroy()
		return fmt.Errorf("%w: the session ended: %w", backend.ErrNotHeld, err)
	}
	return nil
}

// hot returns the context for a statement of a busy shared session (an
// acquire, a release) that must not be cut short by its caller's ctx (a cut
// would end every lease of the session) but must not wait for ever either.
// It is bounded by a deadline on the connection instead of a context: pgx
// watches a context that can end with a callback armed and stopped around
// every statement, which cost about 4% of an uncontended acquire+release
// (docs/postgres.md). The deadline gives every statement that starts before
// it at least cleanupTimeout, and at most an eighth more; it is moved only
// when less than cleanupTimeout is left, so a session used back to back sets
// it a few times a second, not twice per lease. The context keeps ctx's
// values (a pgx tracer's), not its end. mu must be held, and ready checked;
// every other use of the connection comes after usable, startWatch or
// cool, which clear the deadline.
func (p *pin) hot(ctx context.Context) context.Context {
	now := time.Now()
	if p.hotUntil.Sub(now) < cleanupTimeout {
		p.hotUntil = now.Add(cleanupTimeout + cleanupTimeout/8)
		_ = p.pc.Conn().PgConn().Conn().SetDeadline(p.hotUntil)
	}
	return context.WithoutCancel(ctx)
}

// cool clears the deadline hot set on the connection, if it set one. mu
// must be held.
func (p *pin) cool() {
	if !p.hotUntil.IsZero() {
		p.hotUntil = time.Time{}
		_ = p.pc.Conn().PgConn().Conn().SetDeadline(time.Time{})
	}
}

// ping runs the keepalive statement: it resets the server's idle timer, sets
// the session's idle timeout for ttl, and checks that this session still
// holds the lock, in the lease's mode. On any failure the connection is given up, and the error
// wraps backend.ErrNotHeld. mu must be held and the watcher stopped.
func (p *pin) ping(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms, validity, err := leaseTimeout(ttl)
	if err != nil {
		return 0, err
	}
	classid, objid, objsubid := p.key.PgLocks()
	var pid uint32
	var held bool
	err = p.pc.QueryRow(ctx, p.d.sql.ping, strconv.FormatInt(ms, 10), int64(classid), int64(objid), objsubid,
		p.d.sql.mode(p.share).mode).Scan(&pid, nil, &held)
	switch {
	case err != nil:
		p.destroy()
		return 0, fmt.Errorf("%w: keepalive ping failed: %w", backend.ErrNotHeld, err)
	case pid != p.pid:
		p.destroy()
		return 0, fmt.Errorf("%w: %w: the lock was taken in session %d, the ping ran in session %d",
			backend.ErrNotHeld, ErrTransactionPooling, p.pid, pid)
	case !held:
		p.destroy()
		return 0, fmt.Errorf("%w: session %d no longer holds the advisory lock", backend.ErrNotHeld, pid)
	}
	return validity, nil
}

// refresh is Driver.Refresh for this pin.
func (p *pin) refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	if err := p.lock(ctx); err != nil {
		return 0, err
	}
	defer p.unlock()
	if err := p.usable(); err != nil {
		return 0, err
	}
	if p.refreshing != nil {
		p.refreshing()
	}
	v, err := p.ping(ctx, ttl)
	if err != nil {
		return 0, err
	}
	p.startWatch()
	return v, nil
}

// relabelLocked sets the session's application_name, checking that the
// session still holds key's lock in its mode (share: held shared). A
// session that no longer does is given up. mu must be held and the watcher
// stopped.
func (p *pin) relabelLocked(ctx context.Context, key AdvisoryKey, share bool, label string) error {
	classid, objid, objsubid := key.PgLocks()
	var pid uint32
	var held bool
	err := p.pc.QueryRow(ctx, p.d.sql.relabel, label, int64(classid), int64(objid), objsubid, p.d.sql.mode(share).mode).
		Scan(&pid, nil, &held)
	switch {
	case err != nil:
		p.destroy() // unknown whether it ran, and the session is in an unknown state
		return fmt.Errorf("%w: relabel failed: %w", backend.ErrNotHeld, err)
	case pid != p.pid:
		p.destroy()
		return fmt.Errorf("%w: %w: the lock was taken in session %d, the relabel ran in session %d",
			backend.ErrNotHeld, ErrTransactionPooling, p.pid, pid)
	case !held:
		p.destroy()
		return fmt.Errorf("%w: session %d no longer holds the advisory lock", backend.ErrNotHeld, pid)
	}
	return nil
}

// relabel is Driver.Relabel for a lease with a connection of its own.
func (p *pin) relabel(ctx context.Context, label string) error {
	if err := p.lock(ctx); err != nil {
		return err
	}
	defer p.unlock()
	if err := p.usable(); err != nil {
		return err
	}
	if err := p.relabelLocked(ctx, p.key, p.share, label); err != nil {
		return err
	}
	_ = notifyOn(ctx, p.pc.Conn(), p.key) // best effort: followers also poll
	p.startWatch()
	return nil
}

// release is Driver.Release for this pin: unlock, restore the session's idle
// timeout, and return the connection to the pool — only if the unlock was
// confirmed in the session that took the lock. Otherwise the connection is
// closed.
func (p *pin) release(ctx context.Context) error {
	if err := p.lock(ctx); err != nil {
		// A refresh (or the idle watcher's start) holds the connection. The
		// caller will not release this lease again: the connection must not
		// outlive it in the holder's hands.
		p.abandon()
		return err
	}
	defer p.unlock()
	if err := p.usable(); err != nil {
		return err
	}
	var pid uint32
	var held bool
	var err error
	unlock := p.d.sql.mode(p.share).unlock
	if p.d.sql.owned {
		err = p.pc.QueryRow(ctx, unlock, append(p.key.args(), startupAppName(p.pc))...).Scan(&pid, &held, nil, nil)
	} else {
		b := p.d.sql.releaseBatch(unlock, p.key.args(), func(r pgx.Row) error { return r.Scan(&pid, &held) })
		err = p.pc.SendBatch(ctx, b).Close()
	}
	if err := p.unlocked(err, pid, held); err != nil {
		if p.pc != nil {
			p.destroy() // a lease's own session that did not hold its lock: never reuse it
		}
		return err
	}
	if p.announce && notifyOn(ctx, p.pc.Conn(), p.key) != nil {
		p.destroy() // in an unknown state: not back to the pool
		return nil
	}
	p.giveBack()
	return nil
}

// unlocked judges the answer to an unlock on p's session: an error or
// another session's pid gives the session up (closing it frees whatever it
// holds); a lock the session did not hold is reported, and left to the
// caller.
func (p *pin) unlocked(err error, pid uint32, held bool) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Severity == "FATAL":
		// The server ended the session (it was terminated, or timed out):
		// it freed its advisory locks, this lease's among them.
		p.destroy()
		return fmt.Errorf("%w: the session ended: %w", backend.ErrNotHeld, err)
	case err != nil:
		// Unknown whether the unlock ran: closing the session frees the lock.
		p.destroy()
		return fmt.Errorf("unlock: %w", err)
	case pid != p.pid:
		p.destroy()
		return fmt.Errorf("%w: %w: the lock was taken in session %d, the unlock ran in session %d",
			backend.ErrNotHeld, ErrTransactionPooling, p.pid, pid)
	case !held:
		return fmt.Errorf("%w: session %d did not hold the advisory lock", backend.ErrNotHeld, pid)
	}
	return nil
}
