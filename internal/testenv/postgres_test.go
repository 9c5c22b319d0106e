package testenv

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pgQuery runs one statement on a new session and returns the first column
// of its rows.
func pgQuery(t *testing.T, p *Postgres, sql string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dialPostgres(ctx, p.Addr())
	if err != nil {
		t.Fatalf("connect %s: %v\n%s", p.Addr(), err, p.LogTail(20))
	}
	defer c.close()
	rows, err := c.query(sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return rows
}

func TestPostgresLifecycle(t *testing.T) {
	p := StartPostgres(t, WithPostgresSetting("application_name", "testenv"))
	if want := "postgres://postgres@127.0.0.1:" + strconv.Itoa(p.Port()) + "/postgres?sslmode=disable"; p.URL() != want {
		t.Fatalf("URL() = %q, want %q", p.URL(), want)
	}
	if got := pgQuery(t, p, "SHOW data_directory"); len(got) != 1 || got[0] != p.DataDir() {
		t.Fatalf("data_directory = %q, want %q", got, p.DataDir())
	}
	if got := pgQuery(t, p, "SHOW application_name"); len(got) != 1 || got[0] != "testenv" {
		t.Fatalf("WithPostgresSetting: application_name = %q", got)
	}
	pgQuery(t, p, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")

	// TerminateBackend ends one session, and only it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	victim, err := dialPostgres(ctx, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer victim.close()
	other, err := dialPostgres(ctx, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	if _, err := victim.query("SELECT pg_advisory_lock(7)"); err != nil {
		t.Fatal(err)
	}
	p.TerminateBackend(t, victim.backendPID)
	if _, err := victim.query("SELECT 1"); err == nil {
		t.Fatal("the terminated session still answers")
	}
	if rows, err := other.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"); err != nil || rows[0] != "0" {
		t.Fatalf("advisory locks after TerminateBackend: %v, %v; want 0 (the lock dies with its session)", rows, err)
	}

	// Stop is a fast shutdown: a connected client does not hold it up.
	begin := time.Now()
	p.Stop()
	if d := time.Since(begin); d > 5*time.Second || p.Alive() {
		t.Fatalf("Stop with a client connected took %v, Alive() = %v", d, p.Alive())
	}
	p.Stop() // idempotent

	p.Restart()
	if got := pgQuery(t, p, "SELECT v FROM kept"); len(got) != 1 || got[0] != "42" {
		t.Fatalf("after Stop+Restart: %q", got)
	}
	// Committed with a WAL flush (the server default is synchronous_commit=off).
	pgQuery(t, p, "SET synchronous_commit = on; INSERT INTO kept VALUES (43)")

	// Killed: connection refused; flushed commits survive crash recovery.
	oldPID := p.PID()
	p.Kill()
	if p.Alive() {
		t.Fatal("Alive() after Kill")
	}
	if _, err := dialPostgres(ctx, p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect after Kill: %v, want connection refused", err)
	}
	p.Restart()
	if p.PID() == oldPID || !p.Alive() {
		t.Fatalf("after Restart PID = %d (was %d), Alive() = %v", p.PID(), oldPID, p.Alive())
	}
	if got := pgQuery(t, p, "SELECT v FROM kept ORDER BY v"); strings.Join(got, ",") != "42,43" {
		t.Fatalf("after Kill+Restart: %q", got)
	}

	// Paused: neither the postmaster nor a session's backend answers.
	c, err := dialPostgres(ctx, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	p.Pause()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := dialPostgres(short, p.Addr()); err == nil {
		t.Fatal("a new session started while the server was paused")
	}
	cancelShort()
	paused, cancelPaused := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.conn.Exec(paused, "SELECT 1")
	cancelPaused()
	if err == nil {
		t.Fatal("a session's backend answered while the server was paused")
	}
	p.Resume()
	pgQuery(t, p, "SELECT 1") // a new session works once resumed

	// Killed with a session connected: every backend dies with the
	// postmaster, so the restart finds no process on the old shared memory.
	for range 3 {
		p.Kill()
		p.Restart()
		c, err := dialPostgres(ctx, p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		if _, err := c.query("SELECT pg_advisory_lock(1)"); err != nil {
			t.Fatal(err)
		}
	}

	// Restart of a running (and paused) server with a client connected.
	p.Pause()
	p.Restart()
	pgQuery(t, p, "SELECT 1")
}

func TestPostgresCleanup(t *testing.T) {
	var dir string
	var pid int
	var client *pgConn
	defer func() {
		if client != nil {
			client.close()
		}
	}()
	begin := time.Now()
	t.Run("server left running", func(t *testing.T) {
		p := StartPostgres(t)
		pid = p.PID()
		dir = p.DataDir()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Left open on purpose: a connected client must not delay the cleanup.
		var err error
		if client, err = dialPostgres(ctx, p.Addr()); err != nil {
			t.Fatal(err)
		}
	})
	if d := time.Since(begin); d > postgresStopGrace {
		t.Errorf("start and cleanup took %v: the fast shutdown did not work", d)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill(%d, 0) after cleanup = %v, want ESRCH", pid, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("data dir still there after cleanup: %v", err)
	}
}

func TestTerminateBackendRefusesStrangers(t *testing.T) {
	p := StartPostgres(t)
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.TerminateBackend(f, os.Getpid()) // the test binary is no backend
	}()
	<-done
	if !strings.Contains(f.fatal, "not a backend") {
		t.Fatalf("TerminateBackend of a non-backend: fatal = %q", f.fatal)
	}
}
