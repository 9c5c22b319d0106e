package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock/backend"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
	_ backend.Relabeler = (*Driver)(nil)
)

// errNoRecord is the error of Inspect, List, Break and Relabel with
// tokens=sequence, whose grants write no record.
var errNoRecord = fmt.Errorf("mysql: tokens=%s keeps no record of the holders: %w", TokensSequence, errors.ErrUnsupported)

// inspectTries bounds how often Inspect reads again a lock whose holding
// session has not written its record yet (it is between its GET_LOCK and
// its token).
const inspectTries = 10

// record is one row of inspect or list.
type record struct {
	usedBy  sql.NullInt64 // IS_USED_LOCK: the holding session
	key     sql.NullString
	token   sql.NullInt64
	owner   sql.NullString
	label   sql.NullString
	granted sql.NullTime
	holder  sql.NullInt64 // the session of the last grant
	ttlUS   sql.NullInt64
	idle    sql.NullInt64 // seconds the holder's session has been idle (PROCESSLIST.TIME; NULL if not visible)
}

func (r *record) scan(rows interface{ Scan(...any) error }) error {
	return rows.Scan(&r.usedBy, &r.key, &r.token, &r.owner, &r.label, &r.granted, &r.holder, &r.ttlUS, &r.idle)
}

// info is the LockInfo of r, read at now. Expires is the server's
// wait_timeout counted from the holder's last statement, when the server
// shows that session (PROCESSLIST, to whoever may see it).
func (r *record) info(key string, now time.Time) backend.LockInfo {
	info := backend.LockInfo{Key: key, Held: true, Token: uint64(r.token.Int64), Owner: r.owner.String,
		Label: r.label.String, Granted: r.granted.Time, Waiters: -1}
	if r.idle.Valid && r.ttlUS.Valid {
		ttl := time.Duration(ttlSeconds(time.Duration(r.ttlUS.Int64)*time.Microsecond)) * time.Second
		info.Expires = now.Add(ttl - time.Duration(r.idle.Int64)*time.Second)
	}
	return info
}

// Inspect implements backend.Inspector: the session holding key's lock and
// the record its grant wrote in the fence table. A lock held by a session
// that wrote no record (a GET_LOCK on the same name by another program) is
// reported held, with no token. Waiters are not counted (-1): the server
// lists them only to those who may see every session.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	info, _, err := d.inspect(ctx, key)
	return info, err
}

// inspect is Inspect, which also returns the row its LockInfo was read from.
func (d *Driver) inspect(ctx context.Context, key string) (backend.LockInfo, record, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, record{}, errClosed
	}
	if d.opts.Tokens == TokensSequence {
		return backend.LockInfo{Key: key, Waiters: -1}, record{}, errNoRecord
	}
	name := LockName(d.opts.Namespace, key)
	for try := 1; ; try++ {
		var r record
		now := time.Now()
		if err := r.scan(d.db.QueryRowContext(ctx, d.sql.inspect, name, name)); err != nil {
			return backend.LockInfo{Key: key, Waiters: -1}, r, fmt.Errorf("inspect: %w", err)
		}
		switch {
		case !r.usedBy.Valid:
			return backend.LockInfo{Key: key, Waiters: -1}, r, nil
		case r.holder.Valid && r.holder.Int64 == r.usedBy.Int64:
			return r.info(key, now), r, nil
		case try >= inspectTries:
			return backend.LockInfo{Key: key, Held: true, Waiters: -1}, r, nil
		}
		// The holder is between its GET_LOCK and its record.
		t := time.NewTimer(time.Duration(try) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return backend.LockInfo{Key: key, Waiters: -1}, r, ctx.Err()
		}
	}
}

// List implements backend.Inspector: the records whose session holds their
// lock, for keys that start with prefix, in key order.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if d.opts.Tokens == TokensSequence {
		return nil, errNoRecord
	}
	like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
	now := time.Now()
	rows, err := d.db.QueryContext(ctx, d.sql.list, like)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	defer rows.Close()
	var out []backend.LockInfo
	for rows.Next() {
		var r record
		if err := r.scan(rows); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		out = append(out, r.info(r.key.String, now))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return out, nil
}

// breakHook and breakCheckedHook, set by tests, are called by Break with
// the lock's key: between its read of the holder and its check, and between
// its check and its removal (under LOCK TABLES).
var breakHook, breakCheckedHook atomic.Pointer[func(key string)]

// Break implements backend.Breaker: it ends the holding session (KILL
// CONNECTION, which needs the privilege to kill other users' sessions when
// the holder is another user's) and returns once the session has let go of
// the lock; the token stays. It kills only the holder it read: under LOCK
// TABLES of the fence table (the LOCK TABLES privilege), which holds every
// grant back, it checks that the lock's session and the key's record are
// still those it read, and returns ErrNotHeld if they are not. The broken
// holder learns it from its connection (LossNotify) or at its next renewal.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	info, read, err := d.inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	if f := breakHook.Load(); f != nil {
		(*f)(key)
	}
	name := LockName(d.opts.Namespace, key)
	id, err := d.killHolder(ctx, key, read)
	if err != nil {
		return info, fmt.Errorf("key %q: %w", key, err)
	}
	// KILL returns before the session has ended and let go of its locks:
	// wait for that, so that the lock is free when Break returns.
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		var now sql.NullInt64
		if err := d.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&now); err != nil {
			return info, fmt.Errorf("break: the killed session %d still holds the lock: %w", id, err)
		}
		if now.Int64 != id {
			return info, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return info, fmt.Errorf("break: the killed session %d still holds the lock: %w", id, ctx.Err())
		}
	}
}

// killHolder kills the session holding key's lock if it, and the key's record
// in the fence table, are still those of read, and returns its id. It does
// so under LOCK TABLES of the fence table: no grant can record itself
// between the check and the KILL, so the session it kills holds no grant
// it was not read holding. It returns an error wrapping backend.ErrNotHeld
// if the holder changed.
func (d *Driver) killHolder(ctx context.Context, key string, read record) (int64, error) {
	name := LockName(d.opts.Namespace, key)
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("break: %w", err)
	}
	locked := false
	defer func() {
		if locked { // the session's end unlocks the table
			d.discard(conn)
			return
		}
		_ = conn.Close()
	}()
	table := d.opts.Table
	if _, err := conn.ExecContext(ctx, "LOCK TABLES "+table+" WRITE"); err != nil {
		return 0, fmt.Errorf("break: lock the fence table %s (LOCK TABLES privilege): %w", table, err)
	}
	locked = true
	var now record
	err = conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?), MAX(token), MAX(holder) FROM "+table+" WHERE name = ?", name, name).
		Scan(&now.usedBy, &now.token, &now.holder)
	if err != nil {
		return 0, fmt.Errorf("break: %w", err)
	}
	if !now.usedBy.Valid || now.usedBy != read.usedBy || now.token != read.token || now.holder != read.holder {
		return 0, fmt.Errorf("the holder read (session %d, token %d) is no longer the holder (session %d, token %d): %w",
			read.usedBy.Int64, read.token.Int64, now.usedBy.Int64, now.token.Int64, backend.ErrNotHeld)
	}
	id := now.usedBy.Int64
	if f := breakCheckedHook.Load(); f != nil {
		(*f)(key)
	}
	if _, err := conn.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10)); err != nil {
		var me *gomysql.MySQLError
		if errors.As(err, &me) && me.Number == 1094 { // unknown thread id
			return 0, fmt.Errorf("the holding session %d ended before the break: %w", id, backend.ErrNotHeld)
		}
		return 0, fmt.Errorf("break: KILL CONNECTION %d: %w", id, err)
	}
	if _, err := conn.ExecContext(ctx, "UNLOCK TABLES"); err == nil {
		locked = false
	}
	return id, nil
}

// Relabel implements backend.Relabeler: on the lease's session, it sets
// the label of the record if the session holds the lock.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	if d.closed.Load() {
		return errClosed
	}
	if d.opts.Tokens == TokensSequence {
		return errNoRecord
	}
	h, ok := g.Data.(*held)
	if !ok {
		return fmt.Errorf("%w: not a grant of this driver", backend.ErrNotHeld)
	}
	sctx, cancel := statementCtx(ctx)
	defer cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return fmt.Errorf("%w: released", backend.ErrNotHeld)
	}
	res, err := h.conn.ExecContext(sctx, d.sql.relabel, label, h.name)
	if err != nil {
		return sessionErr("relabel", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("relabel: %w", err)
	} else if n == 1 {
		return nil
	}
	// MySQL counts changed rows: the label may have been the same.
	var r sql.NullInt64
	if err := h.conn.QueryRowContext(sctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", h.name).Scan(&r); err != nil {
		return sessionErr("relabel", err)
	}
	if !r.Valid || r.Int64 != 1 {
		return fmt.Errorf("%w: the session does not hold %s", backend.ErrNotHeld, h.name)
	}
	return nil
}
