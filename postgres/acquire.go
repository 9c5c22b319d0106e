package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/backend"
)

// Acquire implements backend.Driver: a free lock is taken in the shared
// session of req.TTL, a held one (if req.Wait) is waited for in the server on
// a connection of its own, which the lease keeps. If ctx ends first, it
// cancels the wait and leaves nothing behind.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	ms, validity, err := leaseTimeout(req.TTL)
	if err != nil {
		return nil, err
	}
	key := d.opts.AdvisoryKey(req.Key)
	// First in a shared session (shared.go): a free lock costs one
	// statement and no connection of its own. A waiting Acquire of a key
	// found held a moment ago goes straight to waiting: the try would only
	// cost a statement per hand-off.
tries:
	for attempt := 0; !req.Wait || !d.contended(key); attempt++ {
		g, retry, err := d.acquireShared(ctx, req, key, ms, validity)
		switch {
		case err == nil:
			return g, nil
		case retry && attempt < 2:
			continue // the shared session had ended: open another
		case errors.Is(err, errApart):
			break tries // the server decides, on a connection of its own
		case errors.Is(err, backend.ErrHeld):
			d.markContended(key)
		}
		if ctx.Err() != nil || !req.Wait {
			return nil, err
		}
		break // wait for it on a connection of its own
	}
	// A waiting Acquire outlives a server restart: while the server cannot
	// be reached, or its connection dies under the wait, it tries again
	// after a pause until ctx ends, as the Locker contract says (it waits
	// until granted or ctx is done). A connection that died holds no lock.
	wait := backend.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	for attempt := 0; ; attempt++ {
		// A TryAcquire gets here only for a shared request the shared
		// session cannot ask (errApart): it waits at most poolWait for a
		// connection, as in the shared session.
		pc, err := d.conn(ctx, req.Wait)
		if err != nil {
			if req.Wait && serverDown(err) && backend.Sleep(ctx, wait.Next()) == nil {
				continue
			}
			return nil, err
		}
		p := newPin(d, pc, key, req.Shared)
		d.track(p)
		p.mu <- struct{}{} // not shared yet; held for the destroy calls below
		g, retry, err := d.acquireOn(ctx, p, req, ms, validity)
		switch {
		case err == nil:
			p.startWatchLater()
		case errors.Is(err, backend.ErrHeld):
			p.giveBack() // the session is as it was
		default:
			p.destroy()
		}
		<-p.mu
		if err == nil {
			return g, nil
		}
		switch {
		case retry && attempt == 0:
			// A pooled connection that had died unnoticed: one more try on
			// another connection, at once.
		case retry && req.Wait && backend.Sleep(ctx, wait.Next()) == nil:
			// The server went away during the wait (a restart): wait for it.
		default:
			return nil, err
		}
	}
}

// serverDown reports whether a connect error says the server is not there
// or not accepting sessions yet: refused or reset (stopped, restarting), or
// SQLSTATE 57P03 cannot_connect_now (starting up, in crash recovery, shutting
// down). Anything else (authentication, a bad database) is not waited out.
func serverDown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P03"
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// acquireOn runs the acquire on p's connection. retry reports a connection
// that died under the request, which another connection may try again. On
// error the caller closes the connection, except after ErrHeld.
// waitedRestarts is how long a waiting acquire's statement may take before
// the driver restarts its lease's clock with a ping (see acquireOn): a
// quarter of the TTL, less than the third after which the keepalive's first
// renewal is due.
func waitedRestarts(ttl time.Duration) time.Duration { return ttl / 4 }

func (d *Driver) acquireOn(ctx context.Context, p *pin, req backend.AcquireRequest, ms int64, validity time.Duration) (g *backend.Grant, retry bool, err error) {
	stmt := d.sql.mode(req.Shared).tryLock
	if req.Wait {
		stmt = d.sql.mode(req.Shared).lock
	}
	var r grantRow
	start := time.Now()
	cancelled, err := withCancelRequest(ctx, p.pc, func(qctx context.Context) error {
		return d.runAcquire(qctx, p.pc, stmt, p.key, req.Key, req.Label, ms, &r)
	})
	token, pid, granted := r.token, r.pid, r.granted
	switch {
	case cancelled:
		// ctx ended during the acquire: whatever the server did, undo it.
		if !p.pc.Conn().IsClosed() {
			d.cleanup(p)
		}
		return nil, false, ctx.Err()
	case err != nil:
		if !p.pc.Conn().IsClosed() {
			// The statement failed after the lock may have been granted (the
			// counter's table is missing, say): a rollback does not release
			// a session lock.
			d.cleanup(p)
			return nil, false, fmt.Errorf("acquire: %w", err)
		}
		// A connection that died (a pooled one the server had closed, say)
		// took no lock that can outlive it: closing it undoes whatever its
		// session did, so another connection may try again.
		return nil, true, fmt.Errorf("acquire: %w", err)
	case !granted:
		return nil, false, backend.ErrHeld
	}
	p.pid = pid
	if !d.proxied && pid != p.pc.Conn().PgConn().PID() {
		d.cleanup(p)
		return nil, false, fmt.Errorf("%w: the server announced process %d at connect, but the lock was taken in session %d",
			ErrTransactionPooling, p.pc.Conn().PgConn().PID(), pid)
	}
	if token <= 0 {
		d.cleanup(p)
		return nil, false, fmt.Errorf("fence counter of %q in %s is %d; tokens must be positive", req.Key, d.table, token)
	}
	// A grant that waited counts its validity from when the blocking request
	// was sent. That is safe: the server's idle timer starts only when the
	// statement ends, after the grant. But it spends the wait: after a long
	// one (over a quarter of the TTL) the clock is restarted with a ping, so
	// that the lease is not born close to its deadline. A shorter wait, such
	// as a contended hand-off's, leaves it to the keepalive, whose first
	// renewal is due a third of the TTL after the request was sent, still
	// ahead: the grant costs no round trip more than the acquire.
	if elapsed := time.Since(start); elapsed > waitedRestarts(req.TTL) {
		start = time.Now()
		// Not cut short by ctx (that would break the connection, and leave
		// the lock to be freed only once the server notices): checked after.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		validity, err = p.ping(pctx, req.TTL)
		cancel()
		if err != nil {
			return nil, false, err // the connection is closed
		}
		if ctx.Err() != nil {
			d.cleanup(p)
			return nil, false, ctx.Err()
		}
	}
	if req.OnLost != nil {
		p.onLost = func() { req.OnLost(errSessionGone) }
	}
	if req.Announce {
		p.announce = true
		_ = notifyOn(ctx, p.pc.Conn(), p.key) // best effort: followers also poll
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(token),
		Start:    start,
		Validity: validity,
		Data:     p,
	}, false, nil
}

// grantRow is what an acquire statement returns when the lock was granted:
// the token and the session's pid (no row: not granted).
type grantRow struct {
	token   int64
	pid     uint32
	granted bool
}

// runAcquire runs stmt (tryLock or lock) for key on pc: one statement on
// the driver's own pool, a transaction that sets its session defaults on a
// caller's (see statements).
func (d *Driver) runAcquire(ctx context.Context, pc *pgxpool.Conn, stmt string, key AdvisoryKey, name, label string, ms int64, r *grantRow) error {
	msText := strconv.FormatInt(ms, 10)
	args := append(key.args(), name, msText, label)
	var token *int64 // NULL: sequence mode found no marker (see sequenceTokens)
	scan := func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&token, &r.pid, nil, nil); err != nil {
				return err
			}
			r.granted = true
		}
		return rows.Err()
	}
	var err error
	if d.sql.owned { // one statement: no batch needed
		var rows pgx.Rows
		if rows, err = pc.Query(ctx, stmt, args...); err == nil {
			err = scan(rows)
		}
	} else {
		err = pc.SendBatch(ctx, d.sql.acquireBatch(stmt, args, msText, scan)).Close()
	}
	switch {
	case err != nil || !r.granted:
		return err
	case token != nil:
		r.token = *token
		return nil
	case d.sql.newEpoch == "":
		return fmt.Errorf("fence counter of %q in %s is NULL", name, d.table)
	}
	return d.newEpoch(ctx, pc, msText, r)
}

// runNext runs stmt, a lockStatements.next, for key on pc: as runAcquire,
// for a later grant of a shared session in sequence mode, whose token is in
// epoch, the session's.
func (d *Driver) runNext(ctx context.Context, pc *pgxpool.Conn, stmt string, key AdvisoryKey, ms int64, epoch int64, r *grantRow) error {
	var value *int64 // NULL: not granted
	var err error
	if d.sql.owned {
		err = pc.QueryRow(ctx, stmt, key.args()...).Scan(&value, &r.pid)
	} else {
		err = pc.SendBatch(ctx, d.sql.acquireBatch(stmt, key.args(), strconv.FormatInt(ms, 10), func(rows pgx.Rows) error {
			return scanOne(rows, &value, &r.pid)
		})).Close()
	}
	if err != nil || value == nil {
		return err
	}
	if *value <= 0 || *value >= epochUnit {
		return fmt.Errorf("the token sequence in %s returned %d, not in 1 to 2^44-1", d.table, *value)
	}
	r.granted = true
	r.token = epoch*epochUnit + *value
	return nil
}

// scanOne scans the one row rows must have into dest, and closes rows.
func scanOne(rows pgx.Rows, dest ...any) error {
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return errors.New("the statement returned no row")
	}
	return rows.Scan(dest...)
}

// newEpoch is the rest of a sequence-mode grant whose server lost its
// marker (a crash, a promotion): a new epoch first, which r's token is
// drawn in. The lock is held; an error here is handled as one after the
// grant. On a caller's pool, in a transaction whose setup makes its commit
// flush (idle in it for at most msText), as counter mode's grants are.
func (d *Driver) newEpoch(ctx context.Context, pc *pgxpool.Conn, msText string, r *grantRow) error {
	var err error
	if d.sql.owned {
		err = pc.QueryRow(ctx, d.sql.newEpoch).Scan(&r.token)
	} else {
		err = pc.SendBatch(ctx, d.sql.acquireBatch(d.sql.newEpoch, nil, msText, func(rows pgx.Rows) error {
			return scanOne(rows, &r.token)
		})).Close()
	}
	if err != nil {
		return fmt.Errorf("new token epoch: %w", err)
	}
	if d.sql.setMark != "" {
		// Committed: later grants may read the epoch from the marker
		// sequence. If this fails they find it reset, and run newEpoch,
		// which finds the table marked and bumps nothing.
		_, _ = pc.Exec(ctx, d.sql.setMark, r.token/epochUnit)
	}
	return nil
}

// cleanup rolls back and releases p's lock (in p's mode), in case the acquire took it,
// before the caller closes the connection: closing alone would free the lock
// too, but only once the server has noticed, after Acquire has returned.
func (d *Driver) cleanup(p *pin) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(d.sql.rollback)
	b.Queue(d.sql.mode(p.share).cleanup, p.key.args()...)
	_ = p.pc.SendBatch(ctx, b).Close()
}

// withCancelRequest runs f on pc with a context that ctx does not cancel.
// When ctx ends first, it sends the server a cancel request, which ends a
// blocked pg_advisory_lock with an error and keeps the connection usable for
// cleanup; if the server has not answered within cancelGrace, it cancels f's
// context, which makes pgx break the connection. cancelled reports that ctx
// ended before f's result was known: the caller must then undo whatever f
// did, and not reuse the connection (a late cancel request could hit its
// next statement).
func withCancelRequest(ctx context.Context, pc *pgxpool.Conn, f func(context.Context) error) (cancelled bool, err error) {
	qctx, qcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer qcancel()
	finished := make(chan struct{})
	cancelDone := make(chan struct{})
	pg := pc.Conn().PgConn()
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelDone)
		cctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
		defer cancel()
		_ = pg.CancelRequest(cctx)
		select {
		case <-finished:
		case <-cctx.Done():
			qcancel()
		}
	})
	err = f(qctx)
	close(finished)
	if !stop() {
		<-cancelDone
		return true, err
	}
	return false, err
}

// ErrTransactionPooling is matched by the error of opening a driver, or of a
// lease's statement, through a pooler in transaction or statement mode, where
// session advisory locks would be shared between clients; connect directly
// or through a pool in session mode.
var ErrTransactionPooling = errors.New("the connection does not keep one server session (a pooler in transaction mode, such as PgBouncer pool_mode=transaction?): session advisory locks would be shared between clients; connect directly or use session pooling")

// checkPooling finds out whether conn talks to PostgreSQL directly, through a
// proxy that keeps one server session per client connection (proxied), or
// through one that does not (ErrTransactionPooling). other opens a second
// client connection for the check.
func checkPooling(ctx context.Context, conn *pgxpool.Conn, other *pgx.ConnConfig) (proxied bool, err error) {
	announced := conn.Conn().PgConn().PID()
	first, err := backendPID(ctx, conn.Conn())
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	if first == announced {
		return false, nil // the server itself: BackendKeyData names this session
	}
	// A proxy answered the startup with its own process id. Does the client
	// connection keep its server session across transactions, and keep it to
	// itself?
	pinned := []uint32{first}
	second, err := backendPID(ctx, conn.Conn())
	if err != nil {
		return true, fmt.Errorf("connect: %w", err)
	}
	pinned = append(pinned, second)
	c2, err := pgx.ConnectConfig(ctx, other)
	if err != nil {
		return true, fmt.Errorf("connect: %w", err)
	}
	stranger, err := backendPID(ctx, c2)
	closeCtx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	_ = c2.Close(closeCtx)
	cancel()
	if err != nil {
		return true, fmt.Errorf("connect: %w", err)
	}
	third, err := backendPID(ctx, conn.Conn())
	if err != nil {
		return true, fmt.Errorf("connect: %w", err)
	}
	pinned = append(pinned, third)
	return true, poolingVerdict(pinned, stranger)
}

// backendPID asks for the session's pid with the simple protocol: a statement
// prepared behind a transaction pool could clash with another client's.
func backendPID(ctx context.Context, c *pgx.Conn) (uint32, error) {
	var pid uint32
	err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}

// poolingVerdict judges the backend pids that successive transactions on one
// client connection saw (pinned), and the one a second client connection saw
// while the first was open (stranger). Behind a session pool every pinned pid
// is the same and the stranger's differs; behind a transaction pool either
// the pinned connection moves between server sessions (a busy pool), or the
// idle server session it used is handed to the stranger (a quiet one).
func poolingVerdict(pinned []uint32, stranger uint32) error {
	for _, pid := range pinned[1:] {
		if pid != pinned[0] {
			return fmt.Errorf("%w: pg_backend_pid() changed from %d to %d between two transactions on one connection",
				ErrTransactionPooling, pinned[0], pid)
		}
	}
	if len(pinned) > 0 && stranger == pinned[0] {
		return fmt.Errorf("%w: two client connections were served by the same server session %d",
			ErrTransactionPooling, stranger)
	}
	return nil
}

// Refresh implements backend.Driver by pinging the lease's session (see
// docs/postgres.md, Leases).
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	switch x := g.Data.(type) {
	case *pin:
		return x.refresh(ctx, ttl)
	case *sharedLease:
		return x.refresh(ctx, ttl)
	}
	return 0, fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
}

// ErrLabelShared is returned by Relabel for a lease whose session holds other
// leases, whose label (the session's application_name) would change too;
// give a lease whose label will change a label of its own.
var ErrLabelShared = errors.New("postgres: the lease's session holds other leases, whose label would change too")

// Relabel implements backend.Relabeler by setting the holding session's
// application_name, failing with ErrLabelShared if it holds other leases.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	switch x := g.Data.(type) {
	case *pin:
		return x.relabel(ctx, label)
	case *sharedLease:
		return x.relabel(ctx, label)
	}
	return fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
}

// Release unlocks the lease's advisory lock; a connection of its own goes
// back to the pool, a shared session once it holds no lock.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	switch x := g.Data.(type) {
	case *pin:
		return x.release(ctx)
	case *sharedLease:
		return x.release(ctx)
	}
	return fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
}
