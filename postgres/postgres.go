package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/sqlstate"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultNamespace is hashed with every key (see HashKey). DSN parameter
	// "namespace".
	DefaultNamespace = "dlock"

	// DefaultTable is the fence counter table. DSN parameter "table".
	DefaultTable = "dlock_fence"

	// DefaultMaxConns is the size of the pool a DSN opens without a
	// pool_max_conns parameter: one shared session per TTL, and one
	// connection per waiting Acquire and the lease it is granted.
	DefaultMaxConns = 64
)

// Tuning of the driver's own waits.
const (
	// cancelGrace is how long a cancelled acquire waits for the server to
	// answer the cancel request before it breaks the connection instead.
	cancelGrace = time.Second
	// cleanupTimeout bounds the statements that clean up after a cancelled
	// acquire, and closing a connection.
	cleanupTimeout = 2 * time.Second
)

var errClosed = fmt.Errorf("postgres driver: %w", backend.ErrClosed)

func init() {
	backend.Register("postgres", open)
	backend.Register("postgresql", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Namespace is hashed with every key (see HashKey): lockers with different
	// namespaces never contend. It must be valid UTF-8 without NUL bytes.
	// Empty means DefaultNamespace ("dlock"). DSN parameter "namespace".
	Namespace string

	// Int4Pair selects the two-int4 form of advisory locks,
	// pg_advisory_lock(ClassID, hash), instead of the default int8 form
	// pg_advisory_lock(hash). DSN parameter "classid" sets both fields.
	Int4Pair bool

	// ClassID is the first key of the two-int4 form: reserve one number per
	// application in a database whose advisory locks several tools use.
	// Ignored unless Int4Pair. Default 0.
	ClassID int32

	// Table is the fence counter table, optionally schema-qualified
	// ("locks.dlock_fence"); each part is quoted as an identifier. Empty means
	// DefaultTable ("dlock_fence"). DSN parameter "table".
	Table string

	// Tokens selects where fencing tokens come from: TokensCounter (the
	// default), a durable counter per key in Table, or TokensSequence, one
	// sequence and a crash epoch, whose grants wait for no WAL flush. Every
	// client of a database must use the same mode. DSN parameter "tokens";
	// docs/postgres.md, Fencing tokens.
	Tokens string
}

// The token modes of Options.Tokens.
const (
	TokensCounter  = "counter"
	TokensSequence = "sequence"
)

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	if !utf8.ValidString(r.Namespace) || strings.IndexByte(r.Namespace, 0) >= 0 {
		return r, errors.New("namespace must be valid UTF-8 without NUL bytes")
	}
	if r.Table == "" {
		r.Table = DefaultTable
	}
	if _, err := tableIdent(r.Table); err != nil {
		return r, err
	}
	switch r.Tokens {
	case "":
		r.Tokens = TokensCounter
	case TokensCounter, TokensSequence:
	default:
		return r, fmt.Errorf("tokens %q: want %s or %s", r.Tokens, TokensCounter, TokensSequence)
	}
	return r, nil
}

// sequenceIdents returns the sanitized names of the sequence mode's objects,
// next to the fence table: its epoch table, its unlogged marker table, its
// sequence and its unlogged marker sequence ("dlock_fence_epoch",
// "dlock_fence_live", "dlock_fence_seq", "dlock_fence_mark").
func sequenceIdents(table string) (epoch, live, seq, mark string) {
	ident, _ := tableIdent(table)
	with := func(suffix string) string {
		id := append(pgx.Identifier(nil), ident...)
		id[len(id)-1] += suffix
		return id.Sanitize()
	}
	return with("_epoch"), with("_live"), with("_seq"), with("_mark")
}

// AdvisoryKey returns the advisory lock a Driver with these options takes for
// key. The zero Options give the default mapping.
func (o Options) AdvisoryKey(key string) AdvisoryKey {
	ns := o.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	h := HashKey(ns, key)
	if o.Int4Pair {
		return AdvisoryKey{Int4Pair: true, Key1: o.ClassID, Key2: int32(h >> 32)}
	}
	return AdvisoryKey{Int8: h}
}

// tableIdent parses "name" or "schema.name" into a quoted identifier.
func tableIdent(table string) (pgx.Identifier, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table %q: want NAME or SCHEMA.NAME", table)
	}
	for _, p := range parts {
		if p == "" || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
			return nil, fmt.Errorf("table %q: want NAME or SCHEMA.NAME", table)
		}
	}
	return pgx.Identifier(parts), nil
}

// Driver is the PostgreSQL implementation of backend.Driver. Its methods are
// safe for concurrent use. Most programs use it through dlock.Open or New;
// build one with NewDriver to pass to dlock.New with your own options.
type Driver struct {
	pool    *pgxpool.Pool
	owned   bool // Close closes pool
	opts    Options
	table   string // quoted
	sql     statements
	proxied bool // a proxy sits between the pool and the server (session pooling)
	closed  atomic.Bool

	mu              sync.Mutex
	pins            map[*pin]struct{}
	shared          map[sharedKey]*shared     // by TTL and label (shared.go)
	lingering       sync.WaitGroup            // the shared sessions' linger timers (shared.go)
	contendedAt     map[AdvisoryKey]time.Time // keys an acquire found held, and when (shared.go)
	contendedPruned time.Time                 // when stale ones were last dropped
	closing         sync.WaitGroup            // connection closes in progress, and the listener (watch.go)

	listen listener           // LISTEN for Watch (watch.go)
	quit   context.Context    // cancelled by Close
	stop   context.CancelFunc // cancels quit
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through pool, which the caller keeps,
// with opts nil for the defaults. Within ctx it checks that the server is
// reachable and not behind a transaction-pooling proxy
// (ErrTransactionPooling), and creates the fence table if it is missing.
func NewDriver(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Driver, error) {
	return newDriver(ctx, pool, opts, false)
}

// newDriver is NewDriver; owned says the driver opened pool, with
// sessionDefaults run on every connection, and closes it.
func newDriver(ctx context.Context, pool *pgxpool.Pool, opts *Options, owned bool) (*Driver, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	ident, _ := tableIdent(o.Table)
	d := &Driver{
		pool:        pool,
		owned:       owned,
		opts:        o,
		table:       ident.Sanitize(),
		pins:        map[*pin]struct{}{},
		shared:      map[sharedKey]*shared{},
		contendedAt: map[AdvisoryKey]time.Time{},
	}
	d.listen.d = d
	d.quit, d.stop = context.WithCancel(context.Background())
	d.sql = newStatements(d.table, o.Int4Pair, owned)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if owned && o.Tokens == TokensSequence {
		// The sessions of this pool commit with synchronous_commit off
		// (sessionDefaults). The objects created below must survive a
		// crash, so their session commits durably and is then closed, not
		// given back with a setting its pool's sessions do not have.
		defer func() { _ = conn.Hijack().Close(context.WithoutCancel(ctx)) }()
		if _, err := conn.Exec(ctx, "SELECT set_config('synchronous_commit', "+durableCommit+", false)"); err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
	} else {
		defer conn.Release()
	}
	if d.proxied, err = checkPooling(ctx, conn, pool.Config().ConnConfig); err != nil {
		return nil, err
	}
	if err := ensureTable(ctx, conn, d.table); err != nil {
		return nil, err
	}
	fastMark, err := ensureTokenMode(ctx, conn, o)
	if err != nil {
		return nil, err
	}
	if o.Tokens == TokensSequence {
		d.sql.sequenceTokens(o.Table, o.Int4Pair, fastMark)
	}
	return d, nil
}

// New returns a dlock.Locker over pool: dlock.New(NewDriver(ctx, pool, opts),
// lockerOpts...). opts may be nil for the defaults. Closing the Locker does
// not close pool.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, pool, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "postgres", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// open is the OpenFunc for the schemes "postgres" and "postgresql".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Namespace: p.String("namespace", DefaultNamespace),
		Table:     p.String("table", DefaultTable),
		Tokens:    p.String("tokens", TokensCounter),
	}
	if s := p.String("classid", ""); s != "" {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: parameter classid=%q: want a whole number from %d to %d",
				dlock.ErrInvalidOption, s, math.MinInt32, math.MaxInt32)
		}
		o.Int4Pair, o.ClassID = true, int32(n)
	}
	rest := p.Rest()
	if err := p.Done(); err != nil {
		return nil, err
	}
	eff, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	cu := *u
	cu.RawQuery = rest.Encode()
	cfg, err := pgxpool.ParseConfig(cu.String())
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, backend.RedactError(err, u))
	}
	if !rest.Has("pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	// The pool is the driver's alone: set the session defaults an acquire
	// needs once per connection rather than in every acquire.
	defaults := sessionDefaults(eff.Tokens == TokensSequence)
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		var appName string
		if err := conn.QueryRow(ctx, defaults).Scan(nil, nil, nil, nil, nil, &appName); err != nil {
			return err
		}
		conn.PgConn().CustomData()[appNameData] = appName
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, backend.RedactError(err, u)
	}
	d, err := newDriver(ctx, pool, &o, true)
	if err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object: a parameter the server does not know
			err = fmt.Errorf("%w: %w (the driver reads namespace, classid, table and tokens; dlock reads ttl, autorenew, label and reentrant; "+
				"pgx reads its own parameters and sends the rest to the server as settings)", dlock.ErrInvalidOption, err)
		}
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}

// markSequenceSince is the server_version_num of the first PostgreSQL with
// unlogged sequences (15); a test raises it to run the marker table's path.
var markSequenceSince = 150000

// ensureTokenMode creates the sequence mode's objects (o.Tokens is
// TokensSequence), or checks that the database has none (TokensCounter): a
// counter-mode token after sequence-mode grants would go backwards. In
// sequence mode it reports whether grants can read the epoch from the
// unlogged marker sequence (PostgreSQL 15 and later; see sequenceTokens):
// where the driver may not create it, or may not read and set the one that
// exists, they read the marker table; one that is not unlogged is refused.
func ensureTokenMode(ctx context.Context, conn *pgxpool.Conn, o Options) (fastMark bool, err error) {
	epoch, live, seq, mark := sequenceIdents(o.Table)
	if o.Tokens != TokensSequence {
		var used bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", epoch).Scan(&used); err != nil {
			return false, fmt.Errorf("looking up %s: %w", epoch, err)
		}
		if used {
			return false, fmt.Errorf("%w: this database's locks take their tokens from a sequence (%s exists): open it with tokens=%s; counter tokens would go backwards",
				dlock.ErrInvalidOption, epoch, TokensSequence)
		}
		return false, nil
	}
	// One look at what exists, first. Objects that exist are not created
	// again: CREATE … IF NOT EXISTS needs the privilege to create, which a
	// role that uses objects an administrator made may not have. The marker
	// sequence is read with pg_sequence_last_value (what the pg_sequences
	// view reads), and must be unlogged: a crash must reset it. A role that
	// may not read and set it (it exists, made by another) reads the table.
	var (
		have        [3]bool
		version     int
		fn          bool
		persistence *string
		usable      *bool
	)
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL,
	current_setting('server_version_num')::int,
	to_regprocedure('pg_catalog.pg_sequence_last_value(regclass)') IS NOT NULL,
	(SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($4)),
	CASE WHEN to_regclass($4) IS NOT NULL THEN has_sequence_privilege($4, 'SELECT') AND has_sequence_privilege($4, 'UPDATE') END`,
		epoch, live, seq, mark).Scan(&have[0], &have[1], &have[2], &version, &fn, &persistence, &usable); err != nil {
		return false, fmt.Errorf("looking up the token objects: %w", err)
	}
	// create runs stmt, which makes an object unless another session just did.
	create := func(stmt string) error {
		if _, err := conn.Exec(ctx, stmt); err != nil && !sqlstate.CreatedMeanwhile(err) {
			return fmt.Errorf("creating the token objects (or create them yourself: %s): %w", stmt, err)
		}
		return nil
	}
	for i, stmt := range []string{
		"CREATE TABLE IF NOT EXISTS " + epoch + " (id int PRIMARY KEY, epoch bigint NOT NULL)",
		"CREATE UNLOGGED TABLE IF NOT EXISTS " + live + " (id int PRIMARY KEY, epoch bigint NOT NULL)",
		"CREATE SEQUENCE IF NOT EXISTS " + seq + " MAXVALUE " + strconv.FormatInt(epochUnit-1, 10) + " CACHE 1",
	} {
		if !have[i] {
			if err := create(stmt); err != nil {
				return false, err
			}
		}
	}
	switch {
	case version < markSequenceSince || !fn:
		return false, nil
	case persistence != nil && *persistence != "u":
		return false, fmt.Errorf("%w: %s is not UNLOGGED: a crash would not reset it, and tokens could go backwards; drop it (the driver makes it unlogged)",
			dlock.ErrInvalidOption, mark)
	case persistence != nil:
		return usable != nil && *usable, nil
	}
	switch err := create("CREATE UNLOGGED SEQUENCE IF NOT EXISTS " + mark); {
	case err == nil:
		return true, nil
	case sqlstate.NoPrivilege(err):
		return false, nil // grants read the marker table
	default:
		return false, err
	}
}

// ensureTable creates the fence table if it does not exist.
func ensureTable(ctx context.Context, conn *pgxpool.Conn, table string) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return fmt.Errorf("looking up the fence table %s: %w", table, err)
	}
	if exists {
		return nil
	}
	create := "CREATE TABLE IF NOT EXISTS " + table + " (key text PRIMARY KEY, token bigint NOT NULL)"
	if _, err := conn.Exec(ctx, create); err != nil {
		if sqlstate.CreatedMeanwhile(err) {
			return nil
		}
		return fmt.Errorf("creating the fence table (or create it yourself: %s): %w", create, err)
	}
	return nil
}

// Name returns "postgres".
func (d *Driver) Name() string { return "postgres" }

// Table returns the fence counter table, quoted.
func (d *Driver) Table() string { return d.table }

// AdvisoryKey returns the advisory lock the driver takes for key.
func (d *Driver) AdvisoryKey(key string) AdvisoryKey { return d.opts.AdvisoryKey(key) }

// Capabilities reports strict fencing, FIFO push-based waiting in the
// server, server-side expiry, loss notification and shared locks; no fault
// tolerance.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		FIFO:          true,
		FaultTolerant: false,
		TimeAuthority: backend.TimeServer,
		PushWait:      true,
		LossNotify:    true,
		Shared:        true,
	}
}

// Close closes the connection of every lease still held (which frees their
// locks on the server) and, if the driver opened the pool from a DSN, closes
// the pool. dlock releases every lease before it calls Close.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	d.mu.Lock()
	for _, s := range d.shared {
		s.stopLinger()
	}
	pins := make([]*pin, 0, len(d.pins))
	for p := range d.pins {
		pins = append(pins, p)
	}
	d.mu.Unlock()
	d.lingering.Wait()
	d.stop() // the listener ends
	for _, p := range pins {
		p.mu <- struct{}{}
		p.destroy()
		<-p.mu
	}
	d.closing.Wait()
	if d.owned {
		d.pool.Close()
	}
	return nil
}

func (d *Driver) track(p *pin) {
	d.mu.Lock()
	d.pins[p] = struct{}{}
	d.mu.Unlock()
}

func (d *Driver) untrack(p *pin) {
	d.mu.Lock()
	delete(d.pins, p)
	d.mu.Unlock()
}

// closeConn closes a connection taken out of the pool, and waits in the
// background until pgx has finished with its socket (Close waits for that).
func (d *Driver) closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	_ = conn.Close(ctx)
	cancel()
	d.closing.Add(1)
	go func() {
		defer d.closing.Done()
		<-conn.PgConn().CleanupDone()
	}()
}

// leaseTimeout returns the idle_session_timeout, in milliseconds, for a TTL
// (rounded up, so the server never ends the session before the TTL), and the
// validity the driver can promise.
func leaseTimeout(ttl time.Duration) (ms int64, validity time.Duration, err error) {
	ms = int64((ttl + time.Millisecond - 1) / time.Millisecond)
	ms = min(max(ms, 1), math.MaxInt32)
	validity = min(ttl, time.Duration(ms)*time.Millisecond) - backend.DriftAllowance(ttl)
	if validity <= 0 {
		return 0, 0, fmt.Errorf("%w: ttl %v is too short for the drift allowance of %v", dlock.ErrInvalidOption, ttl, backend.DriftAllowance(ttl))
	}
	return ms, validity, nil
}
