package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	_ "github.com/dlock-go/dlock/mysql"    // mysql://
	_ "github.com/dlock-go/dlock/sqltable" // mysqltable://
	_ "github.com/go-sql-driver/mysql"     // database/sql's "mysql", for the raw floors

	"github.com/dlock-go/dlock/internal/testenv"
)

type mysqlEnv struct {
	srv   *testenv.MariaDB
	reqs  func() (float64, error)
	impls []impl
}

// startMySQLEnv starts one MariaDB server with durable commits
// (innodb_flush_log_at_trx_commit=1, the default: a log flush per commit, as
// on a production server) and the implementations compared on it.
func startMySQLEnv(tb testing.TB) *mysqlEnv {
	e := &mysqlEnv{srv: testenv.StartMariaDB(tb)}
	e.reqs = mysqlQuestions(tb, e.srv.DSN())
	dsn := e.srv.DSN()
	e.impls = []impl{
		dlockImpl("dlock", e.srv.URL("mysql"), e.reqs),
		// tokens=sequence on its own table: a database holds one token mode.
		dlockImpl("dlock-seq", e.srv.URL("mysql")+"?tokens=sequence&table=dlock_seq_fence", e.reqs),
		dlockImpl("dlock-table", e.srv.URL("mysqltable"), e.reqs),
		{name: "get-lock", newLocker: func(tb testing.TB) locker { return getLock{conn: newMySQLConn(tb, dsn)} }, canWait: true, reqs: e.reqs, oneSessionPerWaiter: true},
		{name: "get-lock-1s", newLocker: func(tb testing.TB) locker { return getLock{conn: newMySQLConn(tb, dsn), chunk: 1} }, canWait: true, reqs: e.reqs, oneSessionPerWaiter: true},
		{name: "shedlock", newLocker: func(tb testing.TB) locker { return newShedLock(tb, dsn) }, canWait: true, reqs: e.reqs},
		{name: "floor", newLocker: func(tb testing.TB) locker { return getLock{conn: newMySQLConn(tb, dsn), try: true} }, reqs: e.reqs},
	}
	return e
}

// mysqlQuestions returns a reader of the statements clients have sent the
// server (the status variable Questions), without the reader's own.
func mysqlQuestions(tb testing.TB, dsn string) func() (float64, error) {
	db := newMySQLDB(tb, dsn)
	var mu sync.Mutex
	var own float64
	return func() (float64, error) {
		mu.Lock()
		defer mu.Unlock()
		own++ // this SHOW counts itself
		var name string
		var n float64
		if err := db.QueryRowContext(context.Background(), "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
			return 0, fmt.Errorf("mysql: reading Questions: %w", err)
		}
		return n - own, nil
	}
}

func newMySQLDB(tb testing.TB, dsn string) *sql.DB {
	db, err := sql.Open("mysql", dsn+"?interpolateParams=true")
	if err != nil {
		tb.Fatalf("mysql: %v", err)
	}
	db.SetMaxOpenConns(1)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// newMySQLConn is one session of its own, as a client process would have.
func newMySQLConn(tb testing.TB, dsn string) *sql.Conn {
	c, err := newMySQLDB(tb, dsn).Conn(context.Background())
	if err != nil {
		tb.Fatalf("mysql: connect: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// getLock is GET_LOCK / RELEASE_LOCK on one session: the peer waits in the
// server (GET_LOCK with a 30s timeout); with chunk set it waits in a bounded
// loop instead (GET_LOCK(name, chunk) asked again until granted, ctx looked at
// between the asks: the other way to make a wait cancellable); the floor asks
// with timeout 0.
type getLock struct {
	conn  *sql.Conn
	try   bool
	chunk int // seconds per GET_LOCK of a bounded wait loop; 0: one GET_LOCK(name, 30)
}

func (g getLock) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait && g.try {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	timeout := 0
	switch {
	case wait && g.chunk > 0:
		timeout = g.chunk
	case wait:
		timeout = 30
	}
	qctx := ctx
	if g.chunk > 0 {
		// Not ctx: go-sql-driver closes the connection when a query's ctx
		// ends. The loop looks at ctx between the asks instead.
		qctx = context.Background()
	}
	var got sql.NullInt64
	for {
		if err := g.conn.QueryRowContext(qctx, "SELECT GET_LOCK(?, ?)", key, timeout).Scan(&got); err != nil {
			return nil, err
		}
		if got.Int64 == 1 || g.chunk == 0 || !wait || ctx.Err() != nil {
			break
		}
	}
	if got.Int64 != 1 && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if got.Int64 != 1 {
		return nil, fmt.Errorf("GET_LOCK(%q): %v", key, got)
	}
	return func() error {
		var r sql.NullInt64
		if err := g.conn.QueryRowContext(context.Background(), "SELECT RELEASE_LOCK(?)", key).Scan(&r); err != nil {
			return err
		}
		if r.Int64 != 1 {
			return fmt.Errorf("RELEASE_LOCK(%q): %v", key, r)
		}
		return nil
	}, nil
}

// shedLock is ShedLock's JDBC storage with the database's time: a row per
// lock name; the first use inserts it (INSERT, the duplicate ignored, as
// ShedLock remembers names it inserted), every lock is one conditional
// UPDATE of lock_until, and the unlock one UPDATE. ShedLock does not wait;
// a waiter here tries again every 10ms, as a caller's retry loop would.
type shedLock struct {
	db       *sql.DB
	mu       sync.Mutex
	inserted map[string]bool
}

const shedLockTable = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL PRIMARY KEY, " +
	"lock_until TIMESTAMP(3) NOT NULL, locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), locked_by VARCHAR(255) NOT NULL)"

func newShedLock(tb testing.TB, dsn string) *shedLock {
	db := newMySQLDB(tb, dsn)
	if _, err := db.ExecContext(context.Background(), shedLockTable); err != nil {
		tb.Fatalf("shedlock: %v", err)
	}
	return &shedLock{db: db, inserted: map[string]bool{}}
}

func (s *shedLock) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	name := key
	if len(name) > 64 {
		name = name[len(name)-64:]
	}
	s.mu.Lock()
	first := !s.inserted[name]
	s.inserted[name] = true
	s.mu.Unlock()
	if first {
		if _, err := s.db.ExecContext(ctx, "INSERT IGNORE INTO shedlock (name, lock_until, locked_at, locked_by) VALUES (?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), '')", name); err != nil {
			return nil, err
		}
	}
	ttlMS := benchTTL.Milliseconds()
	for {
		res, err := s.db.ExecContext(ctx, "UPDATE shedlock SET lock_until = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), locked_at = UTC_TIMESTAMP(3), locked_by = 'bench' "+
			"WHERE name = ? AND lock_until <= UTC_TIMESTAMP(3)", ttlMS*1000, name)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			break
		}
		if !wait {
			return nil, fmt.Errorf("shedlock: %q is held", key)
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	return func() error {
		_, err := s.db.ExecContext(context.Background(), "UPDATE shedlock SET lock_until = UTC_TIMESTAMP(3) WHERE name = ?", name)
		return err
	}, nil
}

// BenchmarkMySQL compares dlock's MySQL driver (GET_LOCK) and its table lock
// with a raw GET_LOCK session, a ShedLock-style table and the floor
// (GET_LOCK with timeout 0) on one MariaDB server; the scenarios are
// BenchmarkRedis's.
func BenchmarkMySQL(b *testing.B) {
	e := startMySQLEnv(b)
	benchBackend(b, e.impls)
}

// BenchmarkMySQLSteps takes the uncontended cycle of dlock with
// tokens=sequence apart, step by step from the floor, all interleaved round by
// round on one MariaDB server:
//
//   - floor: GET_LOCK(name, 0) / RELEASE_LOCK on one session, as in
//     BenchmarkMySQL;
//   - sql: the driver's grant statement for a session that has its epoch
//     (GET_LOCK and the draw in one statement) and RELEASE_LOCK, on one
//     session, under context.Background, sent as text (the driver prepares
//     both once per session) — the SQL alone;
//   - sql+pool: the same on a session taken from a database/sql pool and
//     given back each cycle, as the driver does;
//   - driver: the mysql driver itself (backend.Driver's Acquire and Release,
//     as the Locker calls them), with no Locker;
//   - dlock-seq: dlock.Open with tokens=sequence: the Locker and its lease on
//     that driver.
func BenchmarkMySQLSteps(b *testing.B) {
	srv := testenv.StartMariaDB(b)
	dsn := srv.URL("mysql") + "?tokens=sequence&table=dlock_steps_fence"
	drv := func(tb testing.TB) locker { return openDriver(tb, dsn) }
	impls := []impl{
		{name: "floor", newLocker: func(tb testing.TB) locker { return getLock{conn: newMySQLConn(tb, srv.DSN()), try: true} }},
		{name: "driver", newLocker: drv},
		{name: "sql", newLocker: func(tb testing.TB) locker { return seqSQL{conn: newMySQLConn(tb, srv.DSN())} }},
		{name: "sql+pool", newLocker: func(tb testing.TB) locker {
			db := newMySQLDB(tb, srv.DSN())
			db.SetMaxIdleConns(1)
			return seqSQL{db: db}
		}},
		dlockImpl("dlock-seq", dsn, nil),
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}

// seqGrantSQL is the mysql driver's grant statement with tokens=sequence on
// MariaDB (mysql/sequence.go, newSeqStatements), copied.
const seqGrantSQL = "SELECT CASE GET_LOCK(?, ?) WHEN 1 THEN IF(@@GLOBAL.read_only, 0, IF(IFNULL(@@GLOBAL.gtid_slave_pos, '') = ?, UUID_SHORT(), -1)) WHEN 0 THEN -2 END"

// seqSQL sends the driver's grant statement and RELEASE_LOCK on conn, or on a
// session taken from db for each cycle (BenchmarkMySQLSteps).
type seqSQL struct {
	conn *sql.Conn
	db   *sql.DB
}

func (s seqSQL) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("sql: cannot wait")
	}
	conn := s.conn
	if conn == nil {
		c, err := s.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		conn = c
	}
	var r sql.NullString
	if err := conn.QueryRowContext(context.Background(), seqGrantSQL, key, 0, "").Scan(&r); err != nil || r.String == "-2" || r.String == "0" || r.String == "-1" {
		return nil, fmt.Errorf("grant %q: %v %v", key, r, err)
	}
	return func() error {
		var g sql.NullInt64
		err := conn.QueryRowContext(context.Background(), "SELECT RELEASE_LOCK(?)", key).Scan(&g)
		if s.conn == nil {
			_ = conn.Close()
		}
		if err == nil && g.Int64 != 1 {
			err = fmt.Errorf("RELEASE_LOCK(%q): %v", key, g)
		}
		return err
	}, nil
}
