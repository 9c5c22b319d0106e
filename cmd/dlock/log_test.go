//go:build unix

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// TestLogFormatJSON: with --log-format json, every line each subcommand
// writes to stderr is a JSON record of the documented schema, errors
// included, and an error is at level ERROR.
func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	dead := fmt.Sprintf("redis://u:sekret@127.0.0.1:%d/0", testenv.FreePort(t))
	cases := []struct {
		args []string
		code int
	}{
		{[]string{"nope", "--log-format", "json"}, exitUsage},
		{[]string{"--log-format", "json", "ls"}, exitUsage},
		{[]string{"help", "nope", "--log-format=json"}, exitUsage},
		{[]string{"run", "--log-format", "json", "--dsn", dead, "k"}, exitUsage},
		{[]string{"run", "--log-format", "json", "--dsn", dead, "k", "--", "true"}, exitUnavailable},
		{[]string{"run", "--log-format", "json", "--dsn", dead, "k", "--", "no-such-command-dlock"}, exitNotFound},
		{[]string{"elect", "--log-format", "json", "--dsn", dead, "e", "--", "true"}, exitUnavailable},
		{[]string{"leader", "--log-format", "json", "--dsn", dead, "e"}, exitUnavailable},
		{[]string{"leader", "--log-format", "json", "--dsn", dead}, exitUsage},
		{[]string{"ls", "--log-format", "json", "--dsn", dead}, exitUnavailable},
		{[]string{"ls", "--log-format", "json", "--dsn", dead, "a", "b"}, exitUsage},
		{[]string{"inspect", "--log-format", "json", "--dsn", dead, "k"}, exitUnavailable},
		{[]string{"inspect", "--log-format", "json", "--bogus"}, exitUsage},
		{[]string{"break", "--log-format", "json", "--dsn", dead, "--yes", "k"}, exitUnavailable},
		{[]string{"check", "--log-format", "json", "--dsn", dead}, exitUnavailable},
		{[]string{"check", "--log-format", "json", "extra"}, exitUsage},
		{[]string{"bench", "--log-format", "json", "--dsn", dead, "--duration", "200ms", "--clients", "2"}, exitUnavailable},
		{[]string{"bench", "--log-format", "json", "--clients", "1"}, exitUsage},
		{[]string{"migrate", "dsn", "--log-format", "json", "--from", dead}, exitUsage},
		{[]string{"migrate", "status", "--log-format", "json", "--to", dead}, exitUsage},
	}
	for _, c := range cases {
		name := strings.Join(c.args, " ")
		r := runCLI(t, nil, c.args...)
		if r.code != c.code {
			t.Errorf("dlock %s: exit status %d, want %d\nstderr:\n%s", name, r.code, c.code, r.stderr)
		}
		recs := jsonRecords(t, "dlock "+name, r.stderr)
		if len(recs) == 0 {
			t.Errorf("dlock %s: no record on stderr", name)
		}
		errs := 0
		for _, rec := range recs {
			if rec["level"] == "ERROR" {
				errs++
			}
		}
		if errs == 0 {
			t.Errorf("dlock %s: no record at level ERROR:\n%s", name, r.stderr)
		}
		if strings.Contains(r.stderr, "sekret") {
			t.Errorf("dlock %s printed the password:\n%s", name, r.stderr)
		}
	}

	// A usage error is one record, with the hint in a field.
	r := runCLI(t, nil, "ls", "--log-format", "json", "a", "b")
	if recs := jsonRecords(t, "ls a b", r.stderr); len(recs) != 1 || recs[0]["cmd"] != "ls" || recs[0]["hint"] != "Run 'dlock help ls' for usage." {
		t.Errorf("usage error of ls: %s", r.stderr)
	}
	// --log-format must be text or json.
	r = runCLI(t, nil, "ls", "--log-format", "yaml")
	r.expectCode(t, exitUsage)
	if !strings.Contains(r.stderr, "--log-format must be text or json") {
		t.Errorf("ls --log-format yaml: %s", r.stderr)
	}
}

// TestRunLossJSON: the lines of dlock run about a lost lease and stopping
// the command are JSON records under --log-format json, as is the rest of
// its stderr.
func TestRunLossJSON(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = raw.Close() })
	b := start(t, []string{"DLOCK_DSN=" + srv.URL()}, "run", "-v", "--ttl", "1s", "--log-format", "json", "loss-json", "--", "sh", "-c", "echo started; exec sleep 60")
	b.expectLine("started")
	if n, err := raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, "loss-json")).Result(); err != nil || n != 1 {
		t.Fatalf("DEL the lock key: %d, %v", n, err)
	}
	if code := b.wait(20 * time.Second); code != exitLost {
		t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
	}
	recs := jsonRecords(t, "run", b.stderr.String())
	for _, want := range []struct{ prefix, level string }{
		{"acquired ", "INFO"},
		{"dlock: lease lost", "ERROR"},
		{`lost the lock "loss-json"`, "ERROR"},
		{"stopping the command: SIGTERM now", "WARN"},
		{"the command was stopped because", "ERROR"},
	} {
		rec := findRecord(recs, want.prefix)
		switch {
		case rec == nil:
			t.Errorf("no record %q:\n%s", want.prefix, b.stderr)
		case rec["level"] != want.level || rec["key"] != "loss-json":
			t.Errorf("record %q: level %v key %v, want %s and the key", want.prefix, rec["level"], rec["key"], want.level)
		}
	}
}
