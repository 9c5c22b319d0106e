package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock/etcd/etcdfence"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/httpfence"
	"github.com/dlock-go/dlock/fencing/redisfence"
	"github.com/dlock-go/dlock/fencing/zkfence"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/third_party/zk"
)

// guardWrite is one guard's write and the same write without the guard, on
// one server: plain and guarded each write one value, from one client, a
// new value each time (a write of the value already there may cost less:
// MariaDB then changes no row and flushes nothing).
type guardWrite struct {
	name           string
	plain, guarded func(ctx context.Context) error
}

// guardBenches are BenchmarkGuards' guards: each starts its server and
// returns its writes.
var guardBenches = []struct {
	name  string
	start func(tb testing.TB) []guardWrite
}{
	{"redis", func(tb testing.TB) []guardWrite { return redisGuardWrites(tb, testenv.StartRedis(tb).Addr()) }},
	{"etcd", func(tb testing.TB) []guardWrite { return etcdGuardWrites(tb, testenv.StartEtcd(tb).Endpoint()) }},
	{"zookeeper", func(tb testing.TB) []guardWrite { return zkGuardWrites(tb, testenv.StartZooKeeper(tb).Addr()) }},
	{"postgres", func(tb testing.TB) []guardWrite {
		// Durable commits, as on a production server: each write is a commit.
		srv := testenv.StartPostgres(tb, testenv.WithPostgresSetting("fsync", "on"), testenv.WithPostgresSetting("synchronous_commit", "on"))
		return sqlGuardWrites(tb, "postgres", "pgx", srv.URL())
	}},
	{"mariadb", func(tb testing.TB) []guardWrite {
		return sqlGuardWrites(tb, "mariadb", "mysql", testenv.StartMariaDB(tb).DSN())
	}},
	{"http", httpGuardWrites},
}

// BenchmarkGuards measures what a guard adds to a write: for each guard, the
// same write to the same server made plainly ("plain") and through the guard
// with a current token ("guarded"), one client each, the two interleaved
// round by round in a shuffled order (see inShuffledRounds), so that load
// from other processes hits both alike. It reports plain.ns/op,
// guarded.ns/op (means) and guarded/plain.
func BenchmarkGuards(b *testing.B) {
	for _, gb := range guardBenches {
		b.Run(gb.name, func(b *testing.B) {
			for _, w := range gb.start(b) {
				b.Run(w.name, func(b *testing.B) {
					reportGuardWrites(b, runGuardWrites(b, w, b.N))
				})
			}
		})
	}
}

// guardWriteResult is the total time of n plain and n guarded writes.
type guardWriteResult struct {
	n              int
	plain, guarded time.Duration
}

// runGuardWrites makes n plain and n guarded writes of w, in n rounds of one
// each in a shuffled order, after one warm-up write of each; a failed write
// fails tb.
func runGuardWrites(tb testing.TB, w guardWrite, n int) guardWriteResult {
	ctx := context.Background()
	fs := []func(context.Context) error{w.plain, w.guarded}
	for i, f := range fs {
		if err := f(ctx); err != nil {
			tb.Fatalf("%s: warm-up write %d: %v", w.name, i, err)
		}
	}
	totals := make([]time.Duration, 2)
	resetTimer(tb)
	inShuffledRounds(2, n, func(i int) {
		start := time.Now()
		if err := fs[i](ctx); err != nil {
			tb.Fatalf("%s: write %d: %v", w.name, i, err)
		}
		totals[i] += time.Since(start)
	})
	stopTimer(tb)
	return guardWriteResult{n: n, plain: totals[0], guarded: totals[1]}
}

func reportGuardWrites(tb testing.TB, r guardWriteResult) {
	report(tb, float64(r.plain.Nanoseconds())/float64(r.n), "plain.ns/op")
	report(tb, float64(r.guarded.Nanoseconds())/float64(r.n), "guarded.ns/op")
	report(tb, float64(r.guarded)/float64(r.plain), "guarded/plain")
}

// redisGuardWrites: SET against redisfence's fenced Set (one script: compare
// the fence, set it and the value).
func redisGuardWrites(tb testing.TB, addr string) []guardWrite {
	cli := goredis.NewClient(&goredis.Options{Addr: addr})
	tb.Cleanup(func() { _ = cli.Close() })
	g, v := &redisfence.Guard{Client: cli}, values()
	plainKey, guardedKey := redisfence.Key("guard-bench-plain", ":v"), redisfence.Key("guard-bench", ":v")
	return []guardWrite{{name: "set",
		plain: func(ctx context.Context) error { return cli.Set(ctx, plainKey, v(), 0).Err() },
		guarded: func(ctx context.Context) error {
			return g.Set(ctx, 1, "guard-bench", guardedKey, v(), 0)
		}}}
}

// etcdGuardWrites: Put against etcdfence's fenced Put (one transaction:
// compare the fence key, put it and the value).
func etcdGuardWrites(tb testing.TB, endpoint string) []guardWrite {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	g, v := &etcdfence.Guard{Client: cli}, values()
	return []guardWrite{{name: "put",
		plain: func(ctx context.Context) error { _, err := cli.Put(ctx, "/guard-bench/plain", v()); return err },
		guarded: func(ctx context.Context) error {
			return g.Put(ctx, 1, "guard-bench", "/guard-bench/guarded", v())
		}}}
}

// zkGuardWrites: Set against zkfence's fenced Set (one multi: check the
// fence node's version, set it and the data).
func zkGuardWrites(tb testing.TB, addr string) []guardWrite {
	conn, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(discardZK{}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(conn.Close)
	for _, p := range []string{"/guard-bench-plain", "/guard-bench-guarded"} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
			tb.Fatal(err)
		}
	}
	g, v := &zkfence.Guard{Conn: conn}, values()
	return []guardWrite{{name: "set",
		plain: func(context.Context) error { _, err := conn.Set("/guard-bench-plain", []byte(v()), -1); return err },
		guarded: func(ctx context.Context) error {
			return g.Set(ctx, 1, "guard-bench", "/guard-bench-guarded", []byte(v()))
		}}}
}

// values returns a function that returns a new value at each call.
func values() func() string {
	n := 0
	return func() string { n++; return "v" + strconv.Itoa(n) }
}

type discardZK struct{}

func (discardZK) Printf(string, ...any) {}

// sqlGuardWrites: an UPDATE of one row against SQLGuard.Update of the same
// row with its fence column ("update"), and a transaction that updates a data
// row against SQLGuard.InTx fencing a row of a fence table around the same
// UPDATE ("tx"). Each statement outside a transaction commits on its own.
func sqlGuardWrites(tb testing.TB, dialect, driver, dsn string) []guardWrite {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1) // one client, one connection
	ph, insert := fencing.Dollar, "INSERT INTO %s (id) VALUES ($1) ON CONFLICT DO NOTHING"
	if dialect == "mariadb" {
		ph, insert = fencing.QuestionMark, "INSERT IGNORE INTO %s (id) VALUES (?)"
	}
	ctx := context.Background()
	for _, stmt := range []string{
		"CREATE TABLE IF NOT EXISTS guard_bench (id varchar(200) PRIMARY KEY, v varchar(200) NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0)",
		"CREATE TABLE IF NOT EXISTS guard_bench_fences (id varchar(200) PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			tb.Fatal(err)
		}
	}
	for _, row := range [][2]string{{"guard_bench", "plain"}, {"guard_bench", "guarded"}, {"guard_bench", "tx-plain"}, {"guard_bench", "tx-guarded"}, {"guard_bench_fences", "tx-guarded"}} {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(insert, row[0]), row[1]); err != nil {
			tb.Fatal(err)
		}
	}
	update := "UPDATE guard_bench SET v = " + ph(1) + " WHERE id = " + ph(2)
	rowGuard := &fencing.SQLGuard{Table: "guard_bench", Placeholder: ph}
	txGuard := &fencing.SQLGuard{Table: "guard_bench_fences", Placeholder: ph}
	v := values()
	txWrite := func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, update, v(), id)
		return err
	}
	return []guardWrite{
		{name: "update",
			plain: func(ctx context.Context) error { _, err := db.ExecContext(ctx, update, v(), "plain"); return err },
			guarded: func(ctx context.Context) error {
				return rowGuard.Update(ctx, db, 1, "guarded", "v = "+ph(1), v())
			}},
		{name: "tx",
			plain: func(ctx context.Context) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := txWrite(ctx, tx, "tx-plain"); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			},
			guarded: func(ctx context.Context) error {
				return txGuard.InTx(ctx, db, 1, "tx-guarded", func(tx *sql.Tx) error { return txWrite(ctx, tx, "tx-guarded") })
			}},
	}
}

// httpGuardWrites: a PUT to a bare handler against the same PUT, with a
// token header, to the handler wrapped in an httpfence.Fence; each on a
// loopback server of its own, with a client of its own.
func httpGuardWrites(tb testing.TB) []guardWrite {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	v := values()
	put := func(srv *httptest.Server, token string) func(context.Context) error {
		client := srv.Client()
		return func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/v", strings.NewReader(v()))
			if err != nil {
				return err
			}
			if token != "" {
				req.Header.Set(httpfence.TokenHeader, token)
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				return fmt.Errorf("PUT: %s", resp.Status)
			}
			return nil
		}
	}
	plain, guarded := httptest.NewServer(h), httptest.NewServer((&httpfence.Fence{}).Wrap(h))
	tb.Cleanup(func() {
		plain.Client().CloseIdleConnections()
		guarded.Client().CloseIdleConnections()
		plain.Close()
		guarded.Close()
	})
	return []guardWrite{{name: "put", plain: put(plain, ""), guarded: put(guarded, "1")}}
}
