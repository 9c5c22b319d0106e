package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/batch"
)

// A shared session holds the advisory locks of every lease of the driver
// with one TTL that was granted without waiting: a connection pinned for as
// long as it holds one, whose idle_session_timeout is that TTL. So holding
// N such leases takes one connection, not N, and taking a free lock is one
// statement on it. A lease granted after a wait keeps the connection it
// waited on (a pin of its own): PostgreSQL cannot move a lock between
// sessions.
//
// Advisory locks are re-entrant within a session, so the driver keeps its
// own record of the keys a shared session holds and never asks it for one
// of them twice, in either mode: a second lease of the same key waits on a
// connection of its own, behind the shared session, as a separate client
// would. For a lock held shared this is what keeps a waiting writer from
// being overtaken: PostgreSQL grants a session a lock mode it already holds
// without looking at the queue, so a second shared lease asked of the same
// session would get in ahead of an exclusive request waiting for the key;
// asked on a connection of its own, it queues behind it.
type shared struct {
	d     *Driver
	ms    int64  // its idle_session_timeout: the leases' TTL in milliseconds
	label string // its application_name: the leases' label (Inspect reports it)
	p     *pin   // its connection; p.key is unused
	// set: a grant on p set its idle_session_timeout to ms and its
	// application_name to label, so later grants need not (tryLockSet, next).
	// Guarded by p.mu; relabel keeps application_name equal to label.
	set bool
	// epoch is, in sequence mode, the token epoch of the session's first
	// grant, which its later grants use (lockStatements.next); 0 before it
	// and in counter mode. Guarded by p.mu.
	epoch int64

	// Guarded by d.mu.
	leases     map[AdvisoryKey]*sharedLease // held, and reserved by acquires in flight (nil)
	retired    bool                         // no longer in d.shared: no new lease may join it
	relabeling bool                         // out of d.shared while its label changes: no new lease may join it
	linger     *time.Timer                  // retires s once it has held nothing for shareLinger

	pings *batch.Group // the refreshes' shared pings (at most one per pingGap)
}

// sharedLease is the Data of a grant held by a shared session.
type sharedLease struct {
	s        *shared
	key      AdvisoryKey
	share    bool // held shared (AcquireRequest.Shared)
	onLost   func(error)
	announce bool // acquired with dlock.WithAnnounce: its release is announced (watch.go)
}

// errSessionGone is the loss reported for the leases of a session that ended.
var errSessionGone = errors.New("the session holding the lock ended")

// sharedKey names a shared session: the leases of one TTL and one label
// share one (its idle_session_timeout is the TTL, its application_name the
// label).
type sharedKey struct {
	ms    int64
	label string
}

// sharedFor returns the shared session for TTL ms and label, opening one if there is
// none. An acquire that must not wait for a connection (TryAcquire) waits
// for one at most poolWait.
func (d *Driver) sharedFor(ctx context.Context, ms int64, label string, wait bool) (*shared, error) {
	sk := sharedKey{ms, label}
	d.mu.Lock()
	if s := d.shared[sk]; s != nil {
		d.mu.Unlock()
		return s, nil
	}
	d.mu.Unlock()
	pc, err := d.conn(ctx, wait)
	if err != nil {
		return nil, err
	}
	s := &shared{d: d, ms: ms, label: label, leases: map[AdvisoryKey]*sharedLease{}}
	s.pings = batch.New(pingGap, &d.closing, s.ping)
	s.p = newPin(d, pc, AdvisoryKey{}, false) // p.key and p.share are unused
	s.p.onLost = s.lost
	d.track(s.p)
	d.mu.Lock()
	if other := d.shared[sk]; other != nil { // another acquire opened one meanwhile
		d.mu.Unlock()
		s.p.mu <- struct{}{}
		s.p.giveBack()
		<-s.p.mu
		return other, nil
	}
	d.shared[sk] = s
	d.mu.Unlock()
	return s, nil
}

// contendedFor is how long after an acquire found a key held a waiting
// Acquire of it skips the shared session's try and waits at once.
const contendedFor = time.Second

// contended reports whether an acquire found key held within contendedFor.
func (d *Driver) contended(key AdvisoryKey) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.contendedAt[key]
	return ok && time.Since(at) < contendedFor
}

// maxContended bounds the keys markContended remembers.
const maxContended = 4096

// markContended records that an acquire found key held. Stale records are
// dropped at most once per contendedFor, so the record stays small without
// a scan on every call.
func (d *Driver) markContended(key AdvisoryKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if now.Sub(d.contendedPruned) >= contendedFor {
		d.contendedPruned = now
		for k, at := range d.contendedAt {
			if now.Sub(at) >= contendedFor {
				delete(d.contendedAt, k)
			}
		}
	}
	if len(d.contendedAt) < maxContended {
		d.contendedAt[key] = now
	}
}

// poolWait bounds how long an acquire that must not wait (TryAcquire) waits
// for a connection of the pool.
const poolWait = time.Second

// ErrPoolExhausted is matched by the error of an acquire that needed a
// connection while the pool had none free (not a held lock); raise
// pool_max_conns, or hold fewer leases that waited.
var ErrPoolExhausted = errors.New("every connection of the pool is in use")

// conn takes a connection from the pool; without wait, for at most
// poolWait.
func (d *Driver) conn(ctx context.Context, wait bool) (*pgxpool.Conn, error) {
	cctx := ctx
	if !wait {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, poolWait)
		defer cancel()
	}
	pc, err := d.pool.Acquire(cctx)
	if err == nil {
		return pc, nil
	}
	if ctx.Err() == nil && cctx.Err() != nil {
		st := d.pool.Stat()
		return nil, fmt.Errorf("%w (%d of %d, waited %v)", ErrPoolExhausted, st.AcquiredConns(), st.MaxConns(), poolWait)
	}
	return nil, fmt.Errorf("connect: %w", err)
}

// lost ends every lease of s, once its connection is given up.
func (s *shared) lost() {
	s.d.mu.Lock()
	leases := s.leases
	s.leases = nil
	s.retire()
	s.d.mu.Unlock()
	for _, l := range leases {
		if l != nil && l.onLost != nil {
			l.onLost(errSessionGone)
		}
	}
}

// retire takes s out of d.shared; d.mu must be held.
func (s *shared) retire() {
	if !s.retired {
		s.retired = true
		if sk := (sharedKey{s.ms, s.label}); s.d.shared[sk] == s {
			delete(s.d.shared, sk)
		}
	}
}

// errApart is acquireShared's answer to a shared request for a key the
// shared session holds shared (or is taking): the server may grant it, but
// only on another session, since the shared session never asks for a key
// twice. The request is made on a connection of its own, even a
// TryAcquire.
var errApart = errors.New("the shared session holds the key: ask on a connection of its own")

// acquireShared tries to take key in a shared session: ErrHeld if the lock
// is held, by anyone, this driver's shared session included (errApart for
// a shared request whose key the session holds shared). retry reports a
// shared session that ended under the acquire: another may be tried.
func (d *Driver) acquireShared(ctx context.Context, req backend.AcquireRequest, key AdvisoryKey, ms int64, validity time.Duration) (g *backend.Grant, retry bool, err error) {
	s, err := d.sharedFor(ctx, ms, req.Label, req.Wait)
	if err != nil {
		return nil, false, err
	}
	d.mu.Lock()
	switch held, taken := s.leases[key]; {
	case s.retired || s.relabeling:
		d.mu.Unlock()
		return nil, true, errSessionGone
	case taken && req.Shared && (held == nil || held.share):
		// Held shared, or being taken in a mode not known yet: the server
		// decides, on another session (never this one: see shared).
		d.mu.Unlock()
		return nil, false, errApart
	case taken:
		d.mu.Unlock()
		return nil, false, backend.ErrHeld
	}
	s.leases[key] = nil // reserved
	d.mu.Unlock()
	unreserve := func() {
		d.mu.Lock()
		if s.leases != nil && s.leases[key] == nil {
			delete(s.leases, key)
		}
		d.mu.Unlock()
		s.retireIfIdle()
	}

	p := s.p
	if err := p.lock(ctx); err != nil {
		unreserve()
		return nil, false, err
	}
	if err := p.ready(); err != nil { // the session ended while idle
		<-p.mu
		return nil, true, err
	}
	// Not cut short by ctx: breaking the connection would end every lease
	// of the session. pg_try_advisory_lock does not wait; ctx is checked
	// after.
	var r grantRow
	qctx := p.hot(ctx)
	start := time.Now()
	ls := d.sql.mode(req.Shared)
	switch {
	case !s.set:
		err = d.runAcquire(qctx, p.pc, ls.tryLock, key, req.Key, req.Label, ms, &r)
	case s.epoch > 0: // sequence mode, after the session's first grant
		err = d.runNext(qctx, p.pc, ls.next, key, ms, s.epoch, &r)
	default:
		err = d.runAcquire(qctx, p.pc, ls.tryLockSet, key, req.Key, req.Label, ms, &r)
	}
	token, pid, granted := r.token, r.pid, r.granted
	switch {
	case err != nil:
		// Whether or not the lock was taken, the session cannot be trusted:
		// closing it frees whatever it holds, and ends its leases.
		p.destroy()
		<-p.mu
		return nil, true, fmt.Errorf("acquire: %w", err)
	case !granted:
		p.startWatchLater()
		<-p.mu
		unreserve()
		return nil, false, backend.ErrHeld
	}
	fail := func(err error) (*backend.Grant, bool, error) {
		p.destroy()
		<-p.mu
		return nil, false, err
	}
	switch {
	case p.pid == 0 && !d.proxied && pid != p.pc.Conn().PgConn().PID():
		return fail(fmt.Errorf("%w: the server announced process %d at connect, but the lock was taken in session %d",
			ErrTransactionPooling, p.pc.Conn().PgConn().PID(), pid))
	case p.pid != 0 && pid != p.pid:
		return fail(fmt.Errorf("%w: the session's locks were taken in session %d, this one ran in session %d",
			ErrTransactionPooling, p.pid, pid))
	case token <= 0:
		return fail(fmt.Errorf("fence counter of %q in %s is %d; tokens must be positive", req.Key, d.table, token))
	}
	p.pid = pid
	if !s.set && d.opts.Tokens == TokensSequence {
		s.epoch = token / epochUnit
	}
	s.set = true
	if ctx.Err() != nil { // granted, but the caller has gone: give it back
		err := s.unlock(key, req.Shared)
		p.startWatchLater()
		<-p.mu
		unreserve()
		if err != nil {
			return nil, false, err
		}
		return nil, false, ctx.Err()
	}
	l := &sharedLease{s: s, key: key, share: req.Shared, onLost: req.OnLost, announce: req.Announce}
	d.mu.Lock()
	if s.leases != nil {
		s.leases[key] = l
	}
	d.mu.Unlock()
	if req.Announce {
		p.cool()
		_ = notifyOn(ctx, p.pc.Conn(), key) // best effort: followers also poll
	}
	p.startWatchLater()
	<-p.mu
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(token),
		Start:    start,
		Validity: validity,
		Data:     l,
	}, false, nil
}

// unlock releases key, held shared if share, in s's session, bounded by
// hot; p.mu must be held and ready checked. On an error the session is
// given up (its leases end).
func (s *shared) unlock(key AdvisoryKey, share bool) error {
	p := s.p
	var pid uint32
	var held bool
	err := p.pc.QueryRow(p.hot(context.Background()), s.d.sql.mode(share).sharedUnlock, key.args()...).Scan(&pid, &held)
	return p.unlocked(err, pid, held) // a lock not held is no reason to end the others
}

// release is Driver.Release for a lease of a shared session. If ctx ends
// while the session is busy, the unlock is finished in the background.
func (l *sharedLease) release(ctx context.Context) error {
	s, p := l.s, l.s.p
	if err := p.lock(ctx); err != nil {
		s.d.closing.Add(1)
		go func() { // owned by the driver: Close waits for it
			defer s.d.closing.Done()
			p.mu <- struct{}{}
			_ = l.releaseLocked()
			<-p.mu
			s.retireIfIdle()
		}()
		return err
	}
	err := l.releaseLocked()
	<-p.mu
	s.retireIfIdle()
	return err
}

// releaseLocked unlocks l's key; p.mu must be held.
func (l *sharedLease) releaseLocked() error {
	s, p := l.s, l.s.p
	s.d.mu.Lock()
	mine := s.leases != nil && s.leases[l.key] == l
	if mine {
		delete(s.leases, l.key)
	}
	s.d.mu.Unlock()
	if !mine {
		return fmt.Errorf("%w: %w", backend.ErrNotHeld, errSessionGone)
	}
	if err := p.ready(); err != nil {
		return err
	}
	err := s.unlock(l.key, l.share)
	if err == nil && l.announce && p.pc != nil {
		p.cool()
		if notifyOn(context.Background(), p.pc.Conn(), l.key) != nil {
			p.destroy() // its other leases end: the session is in an unknown state
		}
	}
	if p.pc != nil {
		p.startWatchLater()
	}
	return err
}

// relabel is Driver.Relabel for a lease of a shared session: only while the
// session holds no other lease (ErrLabelShared). The session leaves the
// driver's map first, so no acquire joins it meanwhile, and comes back as
// the new label's session if there is none.
func (l *sharedLease) relabel(ctx context.Context, label string) error {
	s, d := l.s, l.s.d
	d.mu.Lock()
	switch {
	case s.leases == nil || s.leases[l.key] != l:
		d.mu.Unlock()
		return fmt.Errorf("%w: %w", backend.ErrNotHeld, errSessionGone)
	case len(s.leases) > 1:
		n := len(s.leases) - 1
		d.mu.Unlock()
		return fmt.Errorf("%w (%d more)", ErrLabelShared, n)
	}
	if sk := (sharedKey{s.ms, s.label}); d.shared[sk] == s {
		delete(d.shared, sk)
	}
	s.relabeling = true // an acquire that found s before goes elsewhere
	newLabel := s.label
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		s.relabeling = false
		s.label = newLabel
		if sk := (sharedKey{s.ms, newLabel}); d.shared[sk] == nil && !s.retired {
			d.shared[sk] = s
		}
		d.mu.Unlock()
	}()
	p := s.p
	if err := p.lock(ctx); err != nil {
		return err
	}
	defer func() { <-p.mu }()
	if err := p.usable(); err != nil {
		return err
	}
	if err := p.relabelLocked(ctx, l.key, l.share, label); err != nil {
		return err
	}
	_ = notifyOn(ctx, p.pc.Conn(), l.key) // best effort: followers also poll
	p.startWatch()
	newLabel = label
	return nil
}

// shareLinger is how long a shared session that holds no lock stays pinned
// before it goes back to the pool, so that a driver that takes and releases
// locks all the time does not reset and return its session every time.
const shareLinger = time.Second

// retireIfIdle gives s's connection back to the pool, with its idle timeout
// reset, once s has held no lease (and no acquire reserved one) for
// shareLinger.
func (s *shared) retireIfIdle() {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.leases == nil || len(s.leases) > 0 || s.retired || s.linger != nil {
		return
	}
	d.lingering.Add(1) // Close stops the timer or waits for it
	s.linger = time.AfterFunc(shareLinger, func() {
		defer d.lingering.Done()
		s.retireNow()
	})
}

// stopLinger is Close's: it stops s's linger timer, if one is pending.
// d.mu must be held.
func (s *shared) stopLinger() {
	if s.linger != nil && s.linger.Stop() {
		s.d.lingering.Done()
	}
	s.linger = nil
}

// retireNow gives s's connection back to the pool if s still holds nothing.
func (s *shared) retireNow() {
	d := s.d
	d.mu.Lock()
	s.linger = nil
	if s.leases == nil || len(s.leases) > 0 || s.retired {
		d.mu.Unlock()
		return
	}
	s.retire()
	d.mu.Unlock()
	p := s.p
	p.mu <- struct{}{}
	defer func() { <-p.mu }()
	if p.pc == nil || p.usable() != nil {
		return
	}
	d.mu.Lock()
	busy := len(s.leases) > 0 // an acquire reserved a key before it saw s retired
	d.mu.Unlock()
	if busy {
		p.startWatchLater() // its release retires s
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var args []any
	if d.sql.owned {
		args = append(args, startupAppName(p.pc))
	}
	if _, err := p.pc.Exec(ctx, d.sql.sharedReset, args...); err != nil {
		p.destroy()
		return
	}
	p.giveBack()
}

// pingGap is the least time between two pings of a shared session: however
// many of its leases renew, it gets at most one ping per pingGap. A refresh
// waits up to this long for its ping; its validity counts from the moment
// dlock called Refresh, before the ping was sent.
const pingGap = 10 * time.Millisecond

// refresh is Driver.Refresh for a lease of a shared session: a ping of the
// session, shared by the leases that refresh at the same time (at most one
// per pingGap), resets its idle timer for all of them.
func (l *sharedLease) refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms, validity, err := leaseTimeout(ttl)
	if err != nil {
		return 0, err
	}
	if ms != l.s.ms {
		return 0, fmt.Errorf("%w: the lease's TTL is %dms; a refresh cannot change it to %v", dlock.ErrInvalidOption, l.s.ms, ttl)
	}
	s := l.s
	if _, err := s.pings.Do(ctx); err != nil {
		return 0, err
	}
	s.d.mu.Lock()
	mine := s.leases != nil && s.leases[l.key] == l
	s.d.mu.Unlock()
	if !mine {
		return 0, fmt.Errorf("%w: %w", backend.ErrNotHeld, errSessionGone)
	}
	return validity, nil
}

// ping resets s's idle timer and checks its session is the one that took
// its locks. On a failure the session is given up and its leases end.
func (s *shared) ping() error {
	p := s.p
	p.mu <- struct{}{}
	defer func() { <-p.mu }()
	if err := p.usable(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var pid uint32
	err := p.pc.QueryRow(ctx, s.d.sql.sharedPing, strconv.FormatInt(s.ms, 10)).Scan(&pid, nil)
	switch {
	case err != nil:
		p.destroy()
		return fmt.Errorf("%w: keepalive ping failed: %w", backend.ErrNotHeld, err)
	case pid != p.pid:
		p.destroy()
		return fmt.Errorf("%w: %w: the locks were taken in session %d, the ping ran in session %d",
			backend.ErrNotHeld, ErrTransactionPooling, p.pid, pid)
	}
	p.startWatch()
	return nil
}
