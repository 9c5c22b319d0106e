package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/sqlstate"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultTable is the lock table. DSN parameter "table".
	DefaultTable = "dlock_table_locks"

	// DefaultPoll is the longest a waiter waits between two attempts (the
	// wait is jittered, and cut short by the holder's remaining TTL). DSN
	// parameter "poll".
	DefaultPoll = 100 * time.Millisecond

	// DefaultMaxConns is the size of the connection pool a DSN opens. DSN
	// parameter "max_conns".
	DefaultMaxConns = 16
)

// cleanupTimeout bounds the release that gives back a grant racing a
// cancelled acquire.
const cleanupTimeout = 2 * time.Second

var errClosed = fmt.Errorf("sqltable driver: %w", backend.ErrClosed)

// ErrAsyncCommit is returned by NewDriver (and Open) when the database does
// not make a commit durable before it answers (synchronous_commit=off,
// innodb_flush_log_at_trx_commit=0), so tokens could go backwards.
var ErrAsyncCommit = errors.New("sqltable: commits are not durable")

// ErrTableFormat is returned by NewDriver (and Open) when the lock table's
// time columns cannot serve (not timestamptz; a MySQL table in session time
// that cannot be upgraded yet); the error says what to do.
var ErrTableFormat = errors.New("sqltable: the lock table's format does not fit")

func init() {
	backend.Register("pgtable", openPG)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Table is the lock table, created if missing: an identifier, optionally
	// schema-qualified (letters, digits, _; a dot between schema and
	// table). Default DefaultTable.
	Table string

	// Poll is the longest a waiter waits between two attempts. Default
	// DefaultPoll; it must be at least a millisecond.
	Poll time.Duration
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Table == "" {
		r.Table = DefaultTable
	}
	if !identRE.MatchString(r.Table) {
		return r, fmt.Errorf("table %q: want an identifier, optionally schema-qualified (letters, digits, _)", r.Table)
	}
	switch {
	case r.Poll == 0:
		r.Poll = DefaultPoll
	case r.Poll < time.Millisecond:
		return r, fmt.Errorf("poll interval %v: want at least 1ms", r.Poll)
	}
	return r, nil
}

// Driver is the table lock over one database. Its methods are safe for
// concurrent use.
type Driver struct {
	db     *sql.DB
	owned  bool // Close closes db
	opts   Options
	d      *dialect
	closed atomic.Bool
	quit   chan struct{} // closed by Close: waiting acquires end
}

var (
	_ backend.Driver    = (*Driver)(nil)
	_ backend.Named     = (*Driver)(nil)
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
	_ backend.Relabeler = (*Driver)(nil)
)

// Dialects NewDriver knows.
const (
	PostgreSQL = "postgres"
	MySQL      = "mysql" // MySQL and MariaDB
)

// NewDriver returns a table lock over db, which the caller keeps, in dialect
// PostgreSQL or MySQL, with opts nil for the defaults. Within ctx it creates
// the table if missing and checks its time columns (ErrTableFormat),
// upgrading a MySQL table in session time where that is safe.
func NewDriver(ctx context.Context, db *sql.DB, dialectName string, opts *Options) (*Driver, error) {
	return newDriver(ctx, db, dialectName, opts, false)
}

func newDriver(ctx context.Context, db *sql.DB, dialectName string, opts *Options, owned bool) (*Driver, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	var d *dialect
	switch dialectName {
	case PostgreSQL:
		d = postgresDialect(o.Table)
	case MySQL:
		d = mysqlDialect(o.Table)
	default:
		return nil, fmt.Errorf("%w: dialect %q: want %q or %q", dlock.ErrInvalidOption, dialectName, PostgreSQL, MySQL)
	}
	for _, stmt := range d.create {
		if _, err := db.ExecContext(ctx, stmt); err != nil && !sqlstate.CreatedMeanwhile(err) {
			return nil, fmt.Errorf("create the lock table %s: %w", o.Table, err)
		}
	}
	var commit string
	if err := db.QueryRowContext(ctx, d.commitMode).Scan(&commit); err != nil {
		return nil, fmt.Errorf("read the commit mode: %w", err)
	}
	if commit == "off" {
		return nil, fmt.Errorf("%w: the server commits asynchronously (%s): a crash could lose a grant "+
			"and its token, and tokens would go backwards", ErrAsyncCommit, d.asyncAdvice)
	}
	if err := d.checkTable(ctx, db, o.Table); err != nil {
		return nil, err
	}
	return &Driver{db: db, owned: owned, opts: o, d: d, quit: make(chan struct{})}, nil
}

// New returns a dlock.Locker over db: dlock.New(NewDriver(ctx, db, dialect,
// opts), lockerOpts...).
func New(ctx context.Context, db *sql.DB, dialect string, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, db, dialect, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "sqltable", Err: err}
	}
	return dlock.New(d, lockerOpts...)
}

// openPG is the OpenFunc of the scheme pgtable: the DSN is a PostgreSQL URL
// with the scheme pgtable, dlock's parameters (ttl, ...) and this driver's
// (table, poll, max_conns); the others go to pgx. Unless the DSN says
// otherwise, pgx sends each statement with the extended protocol's unnamed
// statement (default_query_exec_mode=exec), which transaction-pooling
// proxies pass.
func openPG(ctx context.Context, u *url.URL) (backend.Driver, error) {
	o, maxConns, rest, err := parseParams(u)
	if err != nil {
		return nil, err
	}
	if !rest.Has("default_query_exec_mode") {
		rest.Set("default_query_exec_mode", "exec")
	}
	cu := *u
	cu.Scheme = "postgres"
	cu.RawQuery = rest.Encode()
	cfg, err := pgx.ParseConfig(cu.String())
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, backend.RedactError(err, u))
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	d, err := newDriver(ctx, db, PostgreSQL, &o, true)
	if err != nil {
		_ = db.Close()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42704" || pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "startup parameter")) {
			// A parameter nobody reads: pgx sent it to the server (or a
			// proxy) as a setting, which refused it.
			err = fmt.Errorf("%w: %w (the driver reads table, poll and max_conns; dlock reads ttl, autorenew, label and reentrant; "+
				"pgx reads its own parameters and sends the rest to the server as settings)", dlock.ErrInvalidOption, err)
		}
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}

// parseParams reads the DSN parameters of dlock's and the driver's (table,
// poll, max_conns) and returns the others, for the database's client.
func parseParams(u *url.URL) (o Options, maxConns int, rest url.Values, err error) {
	p := backend.NewParams(u)
	o = Options{Table: p.String("table", DefaultTable), Poll: p.Duration("poll", DefaultPoll)}
	maxConns = p.Int("max_conns", DefaultMaxConns, 1, 10000)
	rest = p.Rest()
	if err := p.Done(); err != nil {
		return o, 0, nil, err
	}
	if _, err := o.withDefaults(); err != nil {
		return o, 0, nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	return o, maxConns, rest, nil
}

// Name implements backend.Named.
func (d *Driver) Name() string { return "sqltable" }

// Capabilities reports strict fencing and server-side expiry; waiting by
// polling, not FIFO, not fault tolerant, no loss notification.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		TimeAuthority: backend.TimeServer,
	}
}

// Acquire implements backend.Driver: one statement takes the row if it is
// free or expired. A waiting Acquire tries again after a jittered poll
// interval, or when the holder's TTL ends, riding out transient errors until
// ctx ends.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	backoff := backend.Backoff{Min: 10 * time.Millisecond, Max: d.opts.Poll}
	var lastErr error
	for {
		start := time.Now()
		token, left, err := d.attempt(ctx, req)
		switch {
		case err == nil && token > 0:
			validity := req.TTL - backend.DriftAllowance(req.TTL)
			if ctx.Err() != nil { // granted as ctx ended: give it back
				d.giveBack(req)
				return nil, ctx.Err()
			}
			if took := time.Since(start); took >= validity {
				// The server may have granted it at any moment since the
				// request was sent: no validity is left to count on.
				d.giveBack(req)
				err = fmt.Errorf("the grant took %v, longer than its validity of %v: given back", took.Round(time.Millisecond), validity)
				if !req.Wait {
					return nil, err
				}
				lastErr = err
				break
			}
			return &backend.Grant{
				Key:      req.Key,
				Owner:    req.Owner,
				Token:    uint64(token),
				Start:    start,
				Validity: validity,
			}, nil
		case err != nil && ctx.Err() != nil:
			// The statement may have committed before ctx ended it.
			d.giveBack(req)
			return nil, waitEnded(ctx, lastErr)
		case errors.Is(err, context.DeadlineExceeded):
			// The statement outlasted statementTimeout: it may still
			// commit. Give back what it took, if it has (best effort).
			d.giveBack(req)
			if !req.Wait {
				return nil, err
			}
			lastErr = err
		case err != nil && (!req.Wait || !transient(err)):
			return nil, err
		case err != nil:
			lastErr = err
		case !req.Wait:
			return nil, fmt.Errorf("%w (its TTL ends in %v unless renewed)", backend.ErrHeld, left.Round(time.Millisecond))
		default:
			lastErr = nil
			backoff.Reset()
		}
		wait := backend.Jitter(d.opts.Poll)
		if lastErr != nil {
			wait = backoff.Next()
		} else if left >= 0 {
			wait = min(wait, left+time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, waitEnded(ctx, lastErr)
		case <-d.quit:
			t.Stop()
			return nil, errClosed
		}
	}
}

// statementTimeout bounds an acquire statement, which ctx does not cut
// short (see attempt).
const statementTimeout = 5 * time.Second

// attempt runs the acquire statement once: the token if granted (> 0), or
// the holder's remaining TTL (-1 if unknown). ctx does not cut the
// statement short: a cancelled statement may still commit on the server
// after the client has given up on it (the cancel request races it), and a
// release sent at once could run before it and leave the grant behind. The
// statement takes no lock that waits (a row lock for the moment another
// attempt holds it), so it ends within a round trip, and Acquire checks ctx
// after it. Only a statement that outlasts statementTimeout (a stalled
// server) is abandoned, and its grant, if it commits later, is held until
// its TTL.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest) (token int64, left time.Duration, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statementTimeout)
	defer cancel()
	var tok sql.NullInt64
	var leftUS sql.NullInt64
	if d.d.acquireByInsertID {
		res, err := d.db.ExecContext(sctx, d.d.acquire, req.Key, req.Owner, req.Label, req.TTL.Microseconds())
		if err != nil {
			return 0, 0, fmt.Errorf("acquire: %w", err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			return 0, 0, fmt.Errorf("acquire: %w", err)
		}
		if id > 0 {
			return id, 0, nil
		}
		err = d.db.QueryRowContext(sctx, d.d.holderLeft, req.Key).Scan(&leftUS)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, 0, fmt.Errorf("acquire: read the holder's TTL: %w", err)
		}
	} else if err = d.db.QueryRowContext(sctx, d.d.acquire, req.Key, req.Owner, req.Label, req.TTL.Microseconds()).Scan(&tok, &leftUS); err != nil {
		return 0, 0, fmt.Errorf("acquire: %w", err)
	}
	if tok.Valid {
		return tok.Int64, 0, nil
	}
	if !leftUS.Valid {
		return 0, -1, nil
	}
	return 0, time.Duration(max(leftUS.Int64, 0)) * time.Microsecond, nil
}

// giveBack releases req's row if it is req's, on a context of its own.
func (d *Driver) giveBack(req backend.AcquireRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = d.db.ExecContext(ctx, d.d.release, req.Key, req.Owner)
}

// waitEnded is the error of a wait that ends with ctx done, naming the
// transient error the waiter was riding out, if any.
func waitEnded(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ctx.Err()) {
		return ctx.Err()
	}
	return fmt.Errorf("%w (while the database was unreachable: %w)", ctx.Err(), err)
}

// transient reports whether err is worth waiting out: anything but an error
// the server answered about the statement or the session (syntax,
// permissions, authentication).
func transient(err error) bool {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		switch code := se.SQLState(); {
		case strings.HasPrefix(code, "08"), // connection exception
			strings.HasPrefix(code, "57"),    // operator intervention: shutdown, cannot connect now
			strings.HasPrefix(code, "53"),    // insufficient resources
			code == "40001", code == "40P01": // serialization failure, deadlock
			return true
		}
		return false
	}
	return true // no SQLSTATE: the connection failed
}

// Refresh implements backend.Driver: it moves the row's expiry to ttl after
// the server's now, if g's owner holds it and it has not expired.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	args := []any{g.Key, g.Owner, ttl.Microseconds()}
	if d.d.refreshArgs != nil {
		args = d.d.refreshArgs(g.Key, g.Owner, ttl.Microseconds())
	}
	res, err := d.db.ExecContext(ctx, d.d.refresh, args...)
	if err != nil {
		return 0, fmt.Errorf("refresh: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, fmt.Errorf("refresh: %w", err)
	} else if n == 0 {
		return 0, fmt.Errorf("%w: the row is another owner's, or expired", backend.ErrNotHeld)
	}
	return ttl - backend.DriftAllowance(ttl), nil
}

// Release implements backend.Driver: it frees the row if g's owner holds it;
// the token stays, so the next grant's is higher.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	res, err := d.db.ExecContext(ctx, d.d.release, g.Key, g.Owner)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("release: %w", err)
	} else if n == 0 {
		return fmt.Errorf("%w: the row is another owner's", backend.ErrNotHeld)
	}
	return nil
}

// Relabel implements backend.Relabeler: it sets the row's label if g's owner
// holds it and it has not expired; setting the label the row has succeeds.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	if d.closed.Load() {
		return errClosed
	}
	args := []any{g.Key, g.Owner, label}
	if d.d.relabelArgs != nil {
		args = d.d.relabelArgs(g.Key, g.Owner, label)
	}
	res, err := d.db.ExecContext(ctx, d.d.relabel, args...)
	if err != nil {
		return fmt.Errorf("relabel: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("relabel: %w", err)
	} else if n == 1 {
		return nil
	}
	if d.d.heldBy != "" { // the label may have been the same
		var one int
		err := d.db.QueryRowContext(ctx, d.d.heldBy, g.Key, g.Owner).Scan(&one)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("relabel: %w", err)
		}
	}
	return fmt.Errorf("%w: the row is another owner's, or expired", backend.ErrNotHeld)
}

// Inspect implements backend.Inspector: the row, if it is held and not
// expired by the server's clock. Waiters poll and are not counted (-1).
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	infos, err := d.query(ctx, d.d.inspect, key)
	if err != nil {
		return backend.LockInfo{Key: key, Waiters: -1}, err
	}
	if len(infos) == 0 {
		return backend.LockInfo{Key: key, Waiters: -1}, nil
	}
	return infos[0], nil
}

// List implements backend.Inspector: the held rows whose keys start with
// prefix, in key order.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
	return d.query(ctx, d.d.list, like)
}

func (d *Driver) query(ctx context.Context, stmt string, arg any) ([]backend.LockInfo, error) {
	rows, err := d.db.QueryContext(ctx, stmt, arg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.opts.Table, err)
	}
	defer rows.Close()
	var out []backend.LockInfo
	for rows.Next() {
		var info backend.LockInfo
		var grantedUS, leftUS int64
		if err := rows.Scan(&info.Key, &info.Owner, &info.Label, &info.Token, &grantedUS, &leftUS); err != nil {
			return nil, fmt.Errorf("read %s: %w", d.opts.Table, err)
		}
		info.Held, info.Waiters = true, -1
		info.Granted = time.UnixMicro(grantedUS)
		info.Expires = time.Now().Add(time.Duration(leftUS) * time.Microsecond)
		out = append(out, info)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", d.opts.Table, err)
	}
	return out, nil
}

// Break implements backend.Breaker: it frees the row of the holder it read
// (conditional on that owner, so a later holder is never broken); the token
// stays. The broken holder learns it at its next renewal.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	info, err := d.Inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	res, err := d.db.ExecContext(ctx, d.d.release, key, info.Owner)
	if err != nil {
		return info, fmt.Errorf("break: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return info, fmt.Errorf("break: %w", err)
	} else if n == 0 {
		return info, fmt.Errorf("key %q: the holder released it before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}

// Close ends waiting acquires and, if the driver opened the database from a
// DSN, closes it. A held lease's row stays until its TTL (dlock releases its
// leases before it closes the driver).
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	close(d.quit)
	if d.owned {
		return d.db.Close()
	}
	return nil
}
