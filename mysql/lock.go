package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock/backend"
)

// statements are the driver's SQL, for one fence table.
type statements struct {
	create string // the fence table, if missing
	// token: name, key, owner, label, TTL µs. On the session that holds the
	// lock: increments name's counter (the insert ID is the token) and
	// records the holder.
	token string
	// inspect: name, name. One row: the holding session, and the record of
	// the last grant (NULLs if none).
	inspect string
	// list: a LIKE pattern (escape \). The records of the grants whose
	// session holds their lock.
	list string
	// relabel: label, name. On the lease's session.
	relabel string
}

// recordCols are the columns inspect and list read.
const recordCols = "r.`key`, r.token, r.owner, r.label, r.granted_at, r.holder, r.ttl_us, " +
	"(SELECT p.TIME FROM information_schema.PROCESSLIST p WHERE p.ID = r.holder)"

func newStatements(table string) statements {
	return statements{
		create: "CREATE TABLE IF NOT EXISTS " + table + " (\n" +
			"\tname       VARBINARY(64) NOT NULL PRIMARY KEY,\n" +
			"\ttoken      BIGINT NOT NULL,\n" +
			"\t`key`      VARBINARY(1024) NOT NULL,\n" +
			"\towner      VARBINARY(64) NOT NULL,\n" +
			"\tlabel      VARBINARY(128) NOT NULL,\n" +
			"\tgranted_at DATETIME(6) NOT NULL,\n" +
			"\tholder     BIGINT UNSIGNED NOT NULL,\n" +
			"\tttl_us     BIGINT NOT NULL,\n" +
			"\tKEY by_key (`key`)\n" +
			") ENGINE=InnoDB",
		token: "INSERT INTO " + table + " (name, token, `key`, owner, label, granted_at, holder, ttl_us)\n" +
			"VALUES (?, LAST_INSERT_ID(1), ?, ?, ?, NOW(6), CONNECTION_ID(), ?)\n" +
			"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), `key` = VALUES(`key`), owner = VALUES(owner),\n" +
			"\tlabel = VALUES(label), granted_at = VALUES(granted_at), holder = VALUES(holder), ttl_us = VALUES(ttl_us)",
		inspect: "SELECT IS_USED_LOCK(?), " + recordCols + " FROM (SELECT 1) AS one LEFT JOIN " + table + " r ON r.name = ?",
		list: "SELECT IS_USED_LOCK(r.name), " + recordCols + " FROM " + table + " r\n" +
			"WHERE r.`key` LIKE ? AND IS_USED_LOCK(r.name) = r.holder ORDER BY r.`key`",
		relabel: "UPDATE " + table + " SET label = ? WHERE name = ? AND holder = CONNECTION_ID() AND IS_USED_LOCK(name) = CONNECTION_ID()",
	}
}

// connState is what the driver knows of one of the pool's connections: its
// session's id, the wait_timeout it set (0: the server's default), and the
// socket it was dialed over (nil unless the driver dialed it).
type connState struct {
	id          int64
	waitTimeout int
	sock        *sock
	seq         seqState // tokens=sequence: the epoch the session draws under

	// The session's prepared statements, on a pool the driver opened: the
	// server parses them once, not at each use.
	grantStmt, releaseStmt driver.Stmt
}

// held is a grant's Data: the connection pinned to the lease.
type held struct {
	conn   *sql.Conn
	cs     *connState
	name   string
	onLost func(error) // AcquireRequest.OnLost

	mu       sync.Mutex // one statement at a time
	released bool
}

// ttlSeconds is the wait_timeout of a lease with this TTL: the TTL rounded
// up to a second (the variable's unit).
func ttlSeconds(ttl time.Duration) int {
	return int((ttl + time.Second - 1) / time.Second)
}

// Acquire implements backend.Driver: GET_LOCK on a pinned connection whose
// wait_timeout is the TTL, then the key's counter. A waiting Acquire rides
// out a server that is down until ctx ends, which stops the wait with KILL
// QUERY and closes its connection.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	name := LockName(d.opts.Namespace, req.Key)
	b := backend.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	for {
		g, err := d.attempt(ctx, req, name)
		switch {
		case err == nil:
			return g, nil
		case d.closed.Load():
			return nil, errClosed
		case ctx.Err() != nil:
			if errors.Is(err, ctx.Err()) {
				return nil, err
			}
			return nil, fmt.Errorf("%w (while the server was unreachable: %w)", ctx.Err(), err)
		case !req.Wait || !transient(err):
			return nil, err
		}
		t := time.NewTimer(b.Next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (while the server was unreachable: %w)", ctx.Err(), err)
		case <-d.quit.Done():
			t.Stop()
			return nil, errClosed
		}
	}
}

// attempt is one Acquire on one pinned connection.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, name string) (*backend.Grant, error) {
	conn, err := d.pin(ctx, req.Wait)
	if err != nil {
		return nil, err
	}
	cs, err := d.prepare(ctx, conn, ttlSeconds(req.TTL))
	if err != nil {
		d.discard(conn)
		return nil, err
	}
	seq := d.opts.Tokens == TokensSequence
	if seq && !cs.seq.valid {
		if err := d.validate(ctx, conn, cs); err != nil {
			d.discard(conn)
			return nil, fmt.Errorf("token: %w", err)
		}
	}
	for {
		timeout := 0
		if req.Wait {
			timeout = waitChunk
			if dl, ok := ctx.Deadline(); ok {
				timeout = max(min(timeout, int(time.Until(dl)/time.Second)+1), 1)
			}
		}
		var (
			got, cancelled bool
			draw           string
			err            error
			start          = time.Now()
		)
		if seq {
			got, draw, cancelled, err = d.seqGetLock(ctx, conn, cs, name, timeout)
		} else {
			got, cancelled, err = d.getLock(ctx, conn, cs, name, timeout)
		}
		switch {
		case cancelled:
			// Whatever GET_LOCK answered, the session ends with the
			// connection, and with it a grant that raced the cancel.
			if d.closed.Load() {
				d.discard(conn)
				return nil, errClosed
			}
			d.discardHolding(conn, cs, name)
			return nil, ctx.Err()
		case err != nil:
			d.discard(conn)
			return nil, fmt.Errorf("GET_LOCK: %w", err)
		case got && seq:
			return d.seqGrant(ctx, req, conn, cs, name, draw, start)
		case got:
			return d.grant(ctx, req, conn, cs, name)
		case !req.Wait:
			d.release(conn)
			return nil, backend.ErrHeld
		}
	}
}

// grant increments the key's counter on the session that holds the lock;
// the insert ID is the token. The lease's validity counts from just before
// this statement is sent: the session's idle countdown starts only when it
// has been answered.
func (d *Driver) grant(ctx context.Context, req backend.AcquireRequest, conn *sql.Conn, cs *connState, name string) (*backend.Grant, error) {
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	res, err := conn.ExecContext(sctx, d.sql.token, name, req.Key, req.Owner, req.Label, req.TTL.Microseconds())
	var token int64
	if err == nil {
		token, err = res.LastInsertId()
	}
	if err != nil || token <= 0 || ctx.Err() != nil {
		// Closing the session frees the lock: nobody was told it was held.
		d.discardHolding(conn, cs, name)
		if err == nil && token <= 0 {
			err = fmt.Errorf("the counter of %s gave token %d", name, token)
		}
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		return nil, ctx.Err()
	}
	return d.granted(req, conn, cs, name, uint64(token), start), nil
}

// granted records the lease of a grant whose session holds the lock, with
// its token, counted from start, and watches its session.
func (d *Driver) granted(req backend.AcquireRequest, conn *sql.Conn, cs *connState, name string, token uint64, start time.Time) *backend.Grant {
	h := &held{conn: conn, cs: cs, name: name, onLost: req.OnLost}
	d.heldMu.Lock()
	d.held[h] = struct{}{}
	d.heldMu.Unlock()
	if cs.sock != nil && req.OnLost != nil {
		d.watch(h)
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    token,
		Start:    start,
		Validity: req.TTL - backend.DriftAllowance(req.TTL),
		Data:     h,
	}
}

// pin takes a connection of its own from the pool. Only a waiting Acquire
// waits for one past ConnWait.
func (d *Driver) pin(ctx context.Context, wait bool) (*sql.Conn, error) {
	pctx := ctx
	if !wait {
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, d.opts.ConnWait)
		defer cancel()
	}
	conn, err := d.db.Conn(pctx)
	if err == nil {
		return conn, nil
	}
	if st := d.db.Stats(); pctx.Err() != nil && st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		err = fmt.Errorf("%w: all %d are pinned by held leases and waiting acquires (raise max_conns)", ErrNoConnection, st.MaxOpenConnections)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, err
	}
	return nil, fmt.Errorf("connect: %w", err)
}

// prepare returns what the driver knows of conn's session, after setting its
// wait_timeout to secs if it is not set so already.
func (d *Driver) prepare(ctx context.Context, conn *sql.Conn, secs int) (*connState, error) {
	var key any
	_ = conn.Raw(func(dc any) error { key = dc; return nil })
	d.mu.Lock()
	cs := d.conns[key]
	d.mu.Unlock()
	if cs == nil {
		cs = &connState{}
		if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&cs.id); err != nil {
			return nil, fmt.Errorf("read the session id: %w", err)
		}
		if d.reg != nil {
			cs.sock = d.reg.sock(key)
		}
		d.mu.Lock()
		if len(d.conns) > 4*max(d.db.Stats().MaxOpenConnections, 256) {
			clear(d.conns) // forget connections the pool closed
		}
		d.conns[key] = cs
		d.mu.Unlock()
	}
	if cs.waitTimeout != secs {
		if err := setWaitTimeout(ctx, conn, strconv.Itoa(secs)); err != nil {
			return nil, err
		}
		cs.waitTimeout = secs
	}
	return cs, nil
}

func setWaitTimeout(ctx context.Context, conn *sql.Conn, value string) error {
	if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = "+value); err != nil {
		return fmt.Errorf("set wait_timeout: %w", err)
	}
	return nil
}

// getLock runs GET_LOCK(name, timeout) on conn. ctx (or Close) ends a wait
// with KILL QUERY on the session, from another connection, or, if that has
// not ended it within killGrace, by closing conn; then cancelled is true and
// the caller must discard conn.
func (d *Driver) getLock(ctx context.Context, conn *sql.Conn, cs *connState, name string, timeout int) (got, cancelled bool, err error) {
	var r sql.NullInt64
	cancelled, err = d.killable(ctx, cs, func(sctx context.Context) error {
		return conn.QueryRowContext(sctx, "SELECT GET_LOCK(?, ?)", name, timeout).Scan(&r)
	})
	if cancelled || err != nil {
		return false, cancelled, err
	}
	// NULL: an error in the server (out of memory, or the query killed by
	// someone else).
	if !r.Valid {
		return false, false, fmt.Errorf("GET_LOCK(%q) returned NULL", name)
	}
	return r.Int64 == 1, false, nil
}

// killable runs stmt, a statement on cs's session that may wait in
// GET_LOCK, with a context that ctx (or Close) ends with KILL QUERY on the
// session, from another connection, or, if that has not ended it within
// killGrace, by closing the connection; then cancelled is true and the
// caller must discard the connection.
func (d *Driver) killable(ctx context.Context, cs *connState, stmt func(sctx context.Context) error) (cancelled bool, err error) {
	if !d.enter() {
		return true, errClosed
	}
	defer d.calls.Done()
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	killed := make(chan struct{})
	var once sync.Once
	kill := func() {
		once.Do(func() {
			defer close(killed)
			d.killQuery(cs.id)
			t := time.AfterFunc(killGrace, scancel)
			context.AfterFunc(sctx, func() { t.Stop() })
		})
	}
	stop := context.AfterFunc(ctx, kill)
	stopQuit := context.AfterFunc(d.quit, kill)
	err = stmt(sctx)
	if s1, s2 := stop(), stopQuit(); !s1 || !s2 {
		<-killed // the KILL QUERY is done with the pool before Close closes it
		return true, err
	}
	return false, err
}

// quick runs stmt, a statement on cs's session that does not wait in the
// server (a GET_LOCK that does not wait, a RELEASE_LOCK), bounded by ctx's
// deadline or cleanupTimeout from now, whichever comes first, and cut short
// when ctx ends; ok is false when ctx ended first, and the caller must then
// discard the connection. On a socket the driver dialed, stmt gets a context
// that cannot end, and the bound is a deadline on the socket: go-sql-driver
// and database/sql each watch a cancellable context with a goroutine of
// their own for every statement, which costs more than the statement does.
func (d *Driver) quick(ctx context.Context, cs *connState, stmt func(sctx context.Context) error) (ok bool, err error) {
	if cs.sock == nil {
		sctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		defer cancel()
		err = stmt(sctx)
		return ctx.Err() == nil, err
	}
	dl := time.Now().Add(cleanupTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	_ = cs.sock.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = cs.sock.SetDeadline(time.Now()) })
	err = stmt(context.WithoutCancel(ctx))
	if !stop() {
		// The deadline may have been moved to now after this clears it.
		return false, err
	}
	_ = cs.sock.SetDeadline(time.Time{})
	return true, err
}

// queryPrepared runs query, prepared on conn's session once and kept in
// *slot, with args, and returns the first column of its one row. The
// statement dies with the session.
func queryPrepared(ctx context.Context, conn *sql.Conn, slot *driver.Stmt, query string, args ...any) (driver.Value, error) {
	named := make([]driver.NamedValue, len(args))
	for i, a := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	var v driver.Value
	err := conn.Raw(func(dc any) error {
		if *slot == nil {
			p, ok := dc.(driver.ConnPrepareContext)
			if !ok {
				return fmt.Errorf("%T cannot prepare statements", dc)
			}
			st, err := p.PrepareContext(ctx, query)
			if err != nil {
				return err
			}
			*slot = st
		}
		q, ok := (*slot).(driver.StmtQueryContext)
		if !ok {
			return fmt.Errorf("%T cannot run a statement with a context", *slot)
		}
		rows, err := q.QueryContext(ctx, named)
		if err != nil {
			return err
		}
		dest := make([]driver.Value, len(rows.Columns()))
		if err := rows.Next(dest); err != nil {
			_ = rows.Close()
			return err
		}
		v = dest[0]
		return rows.Close()
	})
	return v, err
}

// valueString is a column value of queryPrepared as text; ok is false for
// NULL.
func valueString(v driver.Value) (s string, ok bool) {
	switch v := v.(type) {
	case nil:
		return "", false
	case []byte:
		return string(v), true
	case string:
		return v, true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	}
	return fmt.Sprint(v), true
}

// killQuery stops the statement that session id runs, from another
// connection (best effort, bounded by cleanupTimeout).
func (d *Driver) killQuery(id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = d.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatInt(id, 10))
}

// discard closes conn's session rather than give it back to the pool: the
// server frees every lock the session held.
func (d *Driver) discard(conn *sql.Conn) {
	var key any
	_ = conn.Raw(func(dc any) error { key = dc; return driver.ErrBadConn })
	_ = conn.Close()
	d.mu.Lock()
	delete(d.conns, key)
	d.mu.Unlock()
}

// discardHolding discards conn, whose session may hold the lock name, and
// returns once the server no longer shows that session holding it (at most
// cleanupTimeout): the server frees a closed session's locks only when it
// notices the close, and an Acquire that failed must leave nothing held
// when it returns. It polls, from another connection: the server sends no
// signal.
func (d *Driver) discardHolding(conn *sql.Conn, cs *connState, name string) {
	d.discard(conn)
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for {
		var holder sql.NullInt64
		err := d.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&holder)
		if err != nil || !holder.Valid || holder.Int64 != cs.id {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// release gives conn back to the pool after a refused GET_LOCK, or discards
// it if the pool is the caller's and its wait_timeout cannot be restored.
func (d *Driver) release(conn *sql.Conn) {
	if !d.owned {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		var key any
		_ = conn.Raw(func(dc any) error { key = dc; return nil })
		if err := setWaitTimeout(ctx, conn, "@@GLOBAL.wait_timeout"); err != nil {
			d.discard(conn)
			return
		}
		d.mu.Lock()
		if cs := d.conns[key]; cs != nil {
			cs.waitTimeout = 0
		}
		d.mu.Unlock()
	}
	_ = conn.Close()
}

// Refresh implements backend.Driver: on the lease's session it checks that
// the session holds the lock, which restarts its idle countdown. ctx's
// deadline bounds it; a cancel does not cut it short.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	h, ok := g.Data.(*held)
	if !ok {
		return 0, fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
	}
	sctx, cancel := statementCtx(ctx)
	defer cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if f := refreshHook.Load(); f != nil {
		(*f)(h.name)
	}
	if h.released {
		return 0, fmt.Errorf("%w: released", backend.ErrNotHeld)
	}
	if secs := ttlSeconds(ttl); secs != h.cs.waitTimeout {
		if err := setWaitTimeout(sctx, h.conn, strconv.Itoa(secs)); err != nil {
			return 0, fmt.Errorf("%w: the lock's session: %w", backend.ErrNotHeld, err)
		}
		h.cs.waitTimeout = secs
	}
	var r sql.NullInt64
	if err := h.conn.QueryRowContext(sctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", h.name).Scan(&r); err != nil {
		return 0, fmt.Errorf("%w: the lock's session: %w", backend.ErrNotHeld, err)
	}
	if !r.Valid || r.Int64 != 1 {
		return 0, fmt.Errorf("%w: the session does not hold %s", backend.ErrNotHeld, h.name)
	}
	return ttl - backend.DriftAllowance(ttl), nil
}

// refreshHook, if set, is called by Refresh with the lease's lock name while
// it holds the lease's mutex, before its statements (tests).
var refreshHook atomic.Pointer[func(name string)]

// statementCtx is ctx without its cancel but with its deadline, or
// cleanupTimeout when it has none.
func statementCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(cleanupTimeout)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), dl)
}

// Release implements backend.Driver: RELEASE_LOCK on the lease's session,
// whose connection goes back to the pool, or is closed if the statement
// fails.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	h, ok := g.Data.(*held)
	if !ok {
		return fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
	}
	if d.closed.Load() {
		d.drop(h) // Close may not have reached it yet
		return errClosed
	}
	d.unwatch(h)
	d.heldMu.Lock()
	delete(d.held, h)
	d.heldMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return fmt.Errorf("%w: released already", backend.ErrNotHeld)
	}
	h.released = true
	var r sql.NullInt64
	_, err := d.quick(context.WithoutCancel(ctx), h.cs, func(sctx context.Context) error {
		if !d.owned {
			return h.conn.QueryRowContext(sctx, "SELECT RELEASE_LOCK(?)", h.name).Scan(&r)
		}
		v, err := queryPrepared(sctx, h.conn, &h.cs.releaseStmt, "SELECT RELEASE_LOCK(?)", h.name)
		if s, ok := valueString(v); err == nil && ok {
			r.Int64, err = strconv.ParseInt(s, 10, 64)
			r.Valid = err == nil
		}
		return err
	})
	if err != nil {
		d.discard(h.conn)
		if connGone(err) {
			return sessionErr("release", err)
		}
		return fmt.Errorf("release: %w (the connection is closed: the server frees the lock when it sees the session end)", err)
	}
	d.release(h.conn)
	if !r.Valid || r.Int64 != 1 {
		return fmt.Errorf("%w: the session did not hold %s", backend.ErrNotHeld, h.name)
	}
	return nil
}

// transient reports whether err is worth waiting out: anything but an error
// the server answered about the statement or the session (syntax,
// permissions, authentication), except those that say it is overloaded or
// going away.
func transient(err error) bool {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1040, // too many connections
			1053, // server shutdown in progress
			1205, // lock wait timeout
			1213, // deadlock
			1927: // connection was killed (MariaDB)
			return true
		}
		return strings.HasPrefix(me.Message, "Connection was killed")
	}
	return !errors.Is(err, ErrNoConnection) && !errors.Is(err, ErrReadOnly)
}

// connGone reports whether err says that the pinned connection, and with it
// the lock's session, is gone.
func connGone(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, gomysql.ErrInvalidConn)
}

// sessionErr is the error of a statement on a lease's session: one that
// failed because the connection is gone wraps backend.ErrNotHeld.
func sessionErr(op string, err error) error {
	if connGone(err) {
		return fmt.Errorf("%w: %s: the lock's session has ended: %w", backend.ErrNotHeld, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// drop ends h's session, if it is not released yet, by closing its
// connection: the server frees the lock.
func (d *Driver) drop(h *held) {
	d.unwatch(h)
	d.heldMu.Lock()
	delete(d.held, h)
	d.heldMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.released {
		h.released = true
		d.discard(h.conn)
	}
}
