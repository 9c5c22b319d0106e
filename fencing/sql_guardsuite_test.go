package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/sqltable" // pgtable:// and mysqltable:// for the paused holder's locks
)

// The guard suite on SQLGuard: "update" writes the row's own fence column
// (Update), "tx" fences a row of a table of fences and writes a data table
// in the same transaction (InTx). Config is "DRIVER|DSN".
func registerSQLGuards() {
	for _, dialect := range []string{"postgres", "mariadb"} {
		for _, kind := range []string{"update", "tx"} {
			conformance.RegisterGuard(dialect+"-"+kind, func(ctx context.Context, config, resource string) (conformance.GuardTarget, error) {
				return openSQLTarget(ctx, dialect, kind, config, resource)
			})
		}
	}
}

type sqlTarget struct {
	db       *sql.DB
	kind     string
	ph       func(int) string
	resource string
}

// sqlTables are the suite's tables: guarded has its own fence column; the
// "tx" guard keeps its fences in fences and its values in data.
var sqlTables = []string{
	"CREATE TABLE guarded (id varchar(200) PRIMARY KEY, v varchar(200) NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0)",
	"CREATE TABLE fences (id varchar(200) PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)",
	"CREATE TABLE data (id varchar(200) PRIMARY KEY, v varchar(200) NOT NULL DEFAULT '')",
}

func openSQLTarget(ctx context.Context, dialect, kind, config, resource string) (conformance.GuardTarget, error) {
	driver, dsn, _ := strings.Cut(config, "|")
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	t := &sqlTarget{db: db, kind: kind, ph: fencing.Dollar, resource: resource}
	insert := "INSERT INTO %s (id) VALUES ($1) ON CONFLICT DO NOTHING"
	if dialect == "mariadb" {
		t.ph, insert = fencing.QuestionMark, "INSERT IGNORE INTO %s (id) VALUES (?)"
	}
	for _, table := range []string{"guarded", "fences", "data"} {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(insert, table), resource); err != nil {
			db.Close()
			return nil, err
		}
	}
	return t, nil
}

func (t *sqlTarget) Write(ctx context.Context, tok dlock.Token, v string) error {
	if t.kind == "update" {
		g := fencing.SQLGuard{Table: "guarded", Placeholder: t.ph}
		return g.Update(ctx, t.db, tok, t.resource, "v = "+t.ph(1), v)
	}
	g := fencing.SQLGuard{Table: "fences", Placeholder: t.ph}
	return g.InTx(ctx, t.db, tok, t.resource, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE data SET v = "+t.ph(1)+" WHERE id = "+t.ph(2), v, t.resource)
		return err
	})
}

func (t *sqlTarget) Read(ctx context.Context) (string, error) {
	table := "guarded"
	if t.kind == "tx" {
		table = "data"
	}
	var v string
	err := t.db.QueryRowContext(ctx, "SELECT v FROM "+table+" WHERE id = "+t.ph(1), t.resource).Scan(&v)
	return v, err
}

func (t *sqlTarget) Close() error { return t.db.Close() }

func createSQLTables(t *testing.T, driver, dsn string) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range sqlTables {
		if _, err := db.ExecContext(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGuardSuitePostgres(t *testing.T) {
	// Durable commits (PostgreSQL's default; the test environment's is off,
	// which lost the last commit before a kill, and which pgtable refuses).
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("synchronous_commit", "on"))
	createSQLTables(t, "pgx", srv.URL())
	t.Run("InTxRollsBack", func(t *testing.T) { testInTxRollsBack(t, srv) })
	for _, kind := range []string{"update", "tx"} {
		t.Run(kind, func(t *testing.T) {
			conformance.RunGuardSuite(t, conformance.GuardConfig{
				Guard: "postgres-" + kind, Server: "postgres", Config: "pgx|" + srv.URL(),
				LockDSN: "pgtable://postgres@" + srv.Addr() + "/postgres",
				Restart: func(testing.TB) { srv.Kill(); srv.Restart() }, // crash recovery keeps committed rows
			})
		})
	}
}

func TestGuardSuiteMariaDB(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	createSQLTables(t, "mysql", srv.DSN())
	for _, kind := range []string{"update", "tx"} {
		t.Run(kind, func(t *testing.T) {
			conformance.RunGuardSuite(t, conformance.GuardConfig{
				Guard: "mariadb-" + kind, Server: "mariadb", Config: "mysql|" + srv.DSN(), LockDSN: srv.URL("mysqltable"),
				Restart: func(testing.TB) { srv.Kill(); srv.Restart() }, // InnoDB commits are durable
			})
		})
	}
}

// testInTxRollsBack: a stale token runs nothing of the transaction, and an
// error of the caller's rolls the fence back with the writes.
func testInTxRollsBack(t *testing.T, srv *testenv.Postgres) {
	ctx := context.Background()
	db, err := sql.Open("pgx", srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "INSERT INTO fences (id) VALUES ('r'); INSERT INTO data (id) VALUES ('r')"); err != nil {
		t.Fatal(err)
	}
	g := fencing.SQLGuard{Table: "fences"}
	set := func(v string) func(tx *sql.Tx) error {
		return func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE data SET v = $1 WHERE id = 'r'", v)
			return err
		}
	}
	if err := g.InTx(ctx, db, 5, "r", set("a")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := g.InTx(ctx, db, 9, "r", func(tx *sql.Tx) error { _ = set("b")(tx); return boom }); !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want the caller's error", err)
	}
	ran := false
	err = g.InTx(ctx, db, 4, "r", func(*sql.Tx) error { ran = true; return nil })
	var se *fencing.StaleTokenError
	if !errors.As(err, &se) || se.Token != 4 || se.Highest != 5 || ran {
		t.Fatalf("InTx with token 4 after 5 = %v (fn ran: %v), want a StaleTokenError naming 4 and 5, fn not run", err, ran)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT v FROM data WHERE id = 'r'").Scan(&v); err != nil || v != "a" {
		t.Fatalf("data = %q, %v; want \"a\"", v, err)
	}
	if err := g.InTx(ctx, db, 6, "r", set("c")); err != nil { // the rolled-back 9 left the fence at 5
		t.Fatal(err)
	}
}
