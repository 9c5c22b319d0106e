package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mysqldsn"
	"github.com/dlock-go/dlock/internal/sockstate"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultNamespace is hashed with every key (see LockName). DSN
	// parameter "namespace".
	DefaultNamespace = "dlock"

	// DefaultTable is the fence counter table. DSN parameter "table".
	DefaultTable = "dlock_mysql_fence"

	// DefaultMaxConns is the size of the pool a DSN opens: every held
	// lease and every waiting Acquire pins a connection of its own. DSN
	// parameter "max_conns".
	DefaultMaxConns = 64

	// DefaultConnWait is how long a TryAcquire waits for a free connection
	// before it fails with ErrNoConnection. DSN parameter "conn_wait".
	DefaultConnWait = time.Second
)

// Tuning of the driver's own waits.
const (
	// waitChunk is the longest single GET_LOCK wait: a waiting Acquire
	// asks again when it ends (the server's timeout is in seconds).
	waitChunk = 30
	// killGrace is how long a cancelled wait gives KILL QUERY before it
	// closes the waiting connection instead.
	killGrace = time.Second
	// cleanupTimeout bounds the statements that clean up after a cancel,
	// and a release.
	cleanupTimeout = 2 * time.Second
)

var errClosed = fmt.Errorf("mysql driver: %w", backend.ErrClosed)

// ErrAsyncCommit is returned by NewDriver (and Open) when InnoDB does not
// make a commit durable before it answers (innodb_flush_log_at_trx_commit=0):
// a crash could lose the last tokens granted, and tokens would go backwards.
var ErrAsyncCommit = errors.New("mysql: commits are not durable")

// ErrMultiPrimary is returned by NewDriver (and Open) for a node of a
// multi-primary cluster (Galera, Group Replication in multi-primary mode),
// where another node would grant a user-level lock again.
var ErrMultiPrimary = errors.New("mysql: a user-level lock is local to one node of a multi-primary cluster")

// ErrNoConnection is wrapped by the error of an Acquire that found every
// connection of the pool pinned for longer than Options.ConnWait (not a held
// lock); raise max_conns, or hold fewer locks at once.
var ErrNoConnection = errors.New("mysql: no free connection in the pool")

func init() {
	backend.Register("mysql", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Namespace is hashed with every key (see LockName), 1 to 32 of
	// A-Z a-z 0-9 _ . -; empty means DefaultNamespace. DSN parameter
	// "namespace".
	Namespace string

	// Table is the fence counter table, created if missing: an identifier,
	// optionally qualified by its database (letters, digits, _). Empty
	// means DefaultTable. DSN parameter "table".
	Table string

	// ConnWait is how long a TryAcquire waits for a free connection before
	// it fails with ErrNoConnection (a waiting Acquire waits as long as its
	// ctx allows). Default DefaultConnWait. DSN parameter "conn_wait".
	ConnWait time.Duration

	// Tokens selects where fencing tokens come from: TokensCounter (empty
	// means it), a durable counter per key in Table, or TokensSequence, the
	// server's UUID_SHORT() under a durable epoch, with no write per grant
	// but no Inspect, List, Break or SetLabel. Every client of a database
	// must use the same mode. DSN parameter "tokens"; docs/mysql.md, Tokens.
	Tokens string
}

var (
	namespaceRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)
	identRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)
)

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	if r.Table == "" {
		r.Table = DefaultTable
	}
	if r.ConnWait == 0 {
		r.ConnWait = DefaultConnWait
	}
	if r.Tokens == "" {
		r.Tokens = TokensCounter
	}
	switch {
	case r.Tokens != TokensCounter && r.Tokens != TokensSequence:
		return r, fmt.Errorf("tokens %q: want %s or %s", r.Tokens, TokensCounter, TokensSequence)
	case !namespaceRE.MatchString(r.Namespace):
		return r, fmt.Errorf("namespace %q: want 1 to 32 of A-Z a-z 0-9 _ . -", r.Namespace)
	case !identRE.MatchString(r.Table):
		return r, fmt.Errorf("table %q: want an identifier, optionally qualified by its database (letters, digits, _)", r.Table)
	case r.ConnWait < 0:
		return r, fmt.Errorf("conn_wait %v: want a positive duration", r.ConnWait)
	}
	return r, nil
}

// Driver locks with GET_LOCK on one MySQL or MariaDB server. Its methods are
// safe for concurrent use.
type Driver struct {
	db    *sql.DB
	owned bool // Close closes db
	opts  Options
	sql   statements
	seq   seqStatements // tokens=sequence

	closed atomic.Bool
	quit   context.Context // cancelled by Close: waiting acquires end
	stop   context.CancelFunc

	mu    sync.Mutex
	conns map[any]*connState // by driver connection: what the driver set on it

	reg     *registry // the connections of a pool the driver opened; nil for a caller's pool
	watcher watcher
	wg      sync.WaitGroup // the watcher

	callMu sync.RWMutex   // enter against Close
	calls  sync.WaitGroup // the waits in GET_LOCK, which Close ends before it closes the pool

	heldMu sync.Mutex
	held   map[*held]struct{} // the leases granted and not released: Close ends their sessions
}

// enter registers a wait in GET_LOCK, unless Close has begun.
func (d *Driver) enter() bool {
	d.callMu.RLock()
	defer d.callMu.RUnlock()
	if d.closed.Load() {
		return false
	}
	d.calls.Add(1)
	return true
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through db, which the caller keeps,
// with opts nil for the defaults; every held lease and waiting Acquire pins
// one of its connections. Within ctx it refuses ErrAsyncCommit and
// ErrMultiPrimary servers and creates the fence table if it is missing.
func NewDriver(ctx context.Context, db *sql.DB, opts *Options) (*Driver, error) {
	return newDriver(ctx, db, opts, nil)
}

// newDriver is NewDriver; reg is the registry of the connections of a pool
// the driver opened from a DSN (nil: the caller's pool).
func newDriver(ctx context.Context, db *sql.DB, opts *Options, reg *registry) (*Driver, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if err := checkServer(ctx, db); err != nil {
		return nil, err
	}
	st := newStatements(o.Table)
	var seq seqStatements
	if o.Tokens == TokensSequence {
		pos, err := replicationPos(ctx, db)
		if err != nil {
			return nil, err
		}
		seq = newSeqStatements(o.Table, pos)
	} else if _, err := db.ExecContext(ctx, st.create); err != nil {
		return nil, fmt.Errorf("create the fence table %s: %w", o.Table, err)
	}
	if err := ensureTokenMode(ctx, db, o, seq); err != nil {
		return nil, err
	}
	quit, stop := context.WithCancel(context.Background())
	return &Driver{db: db, owned: reg != nil, opts: o, sql: st, seq: seq, quit: quit, stop: stop, conns: make(map[any]*connState), reg: reg, held: make(map[*held]struct{})}, nil
}

// checkServer refuses servers where a GET_LOCK or a token could be lost:
// InnoDB committing asynchronously, and multi-primary clusters.
func checkServer(ctx context.Context, db *sql.DB) error {
	var flush int
	if err := db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit").Scan(&flush); err != nil {
		return fmt.Errorf("read innodb_flush_log_at_trx_commit: %w", err)
	}
	if flush == 0 {
		return fmt.Errorf("%w: innodb_flush_log_at_trx_commit=0: a crash could lose the last tokens granted, "+
			"and tokens would go backwards; set it to 1 (or 2, which survives a crash of the server but not of its machine)", ErrAsyncCommit)
	}
	// Galera (MariaDB Galera Cluster, Percona XtraDB Cluster): wsrep_on.
	// The variable exists only where the server knows Galera.
	var name, value string
	err := db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("read wsrep_on: %w", err)
	case strings.EqualFold(value, "ON"):
		return fmt.Errorf("%w: the server is a Galera node (wsrep_on=ON): every node grants GET_LOCK on its own; "+
			"use the table lock (mysqltable://) or another backend", ErrMultiPrimary)
	}
	// Group Replication in multi-primary mode, while it runs.
	var members int
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM performance_schema.replication_group_members WHERE MEMBER_STATE = 'ONLINE'").Scan(&members)
	if err == nil && members > 0 {
		var single int
		if err := db.QueryRowContext(ctx, "SELECT @@group_replication_single_primary_mode").Scan(&single); err == nil && single == 0 {
			return fmt.Errorf("%w: the server is a member of a multi-primary replication group: every primary grants GET_LOCK on its own; "+
				"use single-primary mode, the table lock (mysqltable://), or another backend", ErrMultiPrimary)
		}
	}
	return nil
}

// New returns a dlock.Locker over db: dlock.New(NewDriver(ctx, db, opts),
// lockerOpts...).
func New(ctx context.Context, db *sql.DB, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, db, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "mysql", Err: err}
	}
	return dlock.New(d, lockerOpts...)
}

// open is the OpenFunc of the scheme mysql: a URL
// mysql://user:password@host:3306/db?… with dlock's parameters (ttl, …) and
// this driver's (namespace, table, max_conns, conn_wait, tokens); the others are
// go-sql-driver/mysql's (tls, timeout, …); any other is refused. Unless the
// DSN says otherwise, the client interpolates arguments
// (interpolateParams=true: one round trip per statement).
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Namespace: p.String("namespace", DefaultNamespace),
		Table:     p.String("table", DefaultTable),
		ConnWait:  p.Duration("conn_wait", DefaultConnWait),
		Tokens:    p.String("tokens", TokensCounter),
	}
	maxConns := p.Int("max_conns", DefaultMaxConns, 1, 100000)
	rest := p.Rest()
	if err := p.Done(); err != nil {
		return nil, err
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	cfg, err := mysqldsn.Config(u, rest, "namespace, table, max_conns, conn_wait and tokens")
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil || cfg.Logger == gomysql.NewConfig().Logger {
		// go-sql-driver/mysql logs, on its own, every connection the server
		// closed while it sat idle: the driver's sessions end that way by
		// design (wait_timeout), and it reports errors itself.
		cfg.Logger = quietLogger{}
	}
	reg := newRegistry()
	if sockstate.Supported {
		cfg.DialFunc = reg.dial
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, backend.RedactError(err, u))
	}
	db := sql.OpenDB(connector{Connector: conn, r: reg})
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	d, err := newDriver(ctx, db, &o, reg)
	if err != nil {
		_ = db.Close()
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}

// Name implements backend.Named.
func (d *Driver) Name() string { return "mysql" }

// Capabilities reports strict fencing, server-side expiry and push-based
// waiting in the server; not FIFO, not fault tolerant, and loss notification
// only for a pool opened from a DSN, on Linux.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		TimeAuthority: backend.TimeServer,
		PushWait:      true,
		LossNotify:    d.reg != nil && sockstate.Supported,
	}
}

// Close ends waiting acquires, closes the connection of every lease still
// held (freeing its lock) and the pool if it opened it from a DSN.
func (d *Driver) Close() error {
	// Under callMu, so that every enter that saw the driver open has added
	// to calls before Wait below begins.
	d.callMu.Lock()
	already := d.closed.Swap(true)
	d.callMu.Unlock()
	if already {
		return errClosed
	}
	d.stop() // the waits in GET_LOCK are killed, through the pool
	d.calls.Wait()
	d.wg.Wait()
	d.heldMu.Lock()
	hs := make([]*held, 0, len(d.held))
	for h := range d.held {
		hs = append(hs, h)
	}
	d.heldMu.Unlock()
	for _, h := range hs {
		d.drop(h)
	}
	if d.owned {
		// Every lease was released or dropped above. What is left is idle
		// sessions, and closing one only says goodbye (COM_QUIT): one the
		// server already ended (its wait_timeout was a lease's TTL) fails
		// to, which loses nothing, so it is no error of Close.
		_ = d.db.Close()
	}
	return nil
}

// quietLogger is the go-sql-driver/mysql Logger of the pools the driver
// opens.
type quietLogger struct{}

func (quietLogger) Print(...any) {}
