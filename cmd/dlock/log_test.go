//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// jsonRecords checks that every non-empty line of stderr is a JSON object
// with the keys of dlock help logging's schema, and returns the records.
func jsonRecords(t *testing.T, what, stderr string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(stderr) {
		line = strings.TrimRight(line, "\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("%s: a line of stderr is not JSON: %q\nstderr:\n%s", what, line, stderr)
			continue
		}
		ts, _ := rec["time"].(string)
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("%s: record without an RFC 3339 time: %q", what, line)
		}
		switch rec["level"] {
		case "DEBUG", "INFO", "WARN", "ERROR":
		default:
			t.Errorf("%s: record without a level: %q", what, line)
		}
		if m, _ := rec["msg"].(string); m == "" {
			t.Errorf("%s: record without a msg: %q", what, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// findRecord returns the first record whose msg starts with prefix.
func findRecord(recs []map[string]any, prefix string) map[string]any {
	for _, r := range recs {
		if m, _ := r["msg"].(string); strings.HasPrefix(m, prefix) {
			return r
		}
	}
	return nil
}

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
		if errs == 0 && !strings.HasPrefix(name, "check") && !strings.HasPrefix(name, "migrate") {
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

// jsonLog turns text lines into records, passes records through, and drops
// the "dlock CMD: " prefix into the cmd field.
func TestJSONLog(t *testing.T) {
	var out bytes.Buffer
	w, restore := setupLogging([]string{"migrate", "--log-format", "json"}, &out)
	defer restore()
	fmt.Fprint(w, "dlock migrate dsn: passwords are shown as xxxxx\n{\"time\":\"2026-11-28T17:00:00Z\",\"level\":\"ERROR\",\"msg\":\"dlock: lease lost\"}\n\ndlock: warning: evict")
	fmt.Fprint(w, "ion\nBreak it? [y/N] ")
	restore()
	recs := jsonRecords(t, "jsonLog", out.String())
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4:\n%s", len(recs), out.String())
	}
	for i, want := range []struct{ msg, level string }{
		{"passwords are shown as xxxxx", "INFO"},
		{"dlock: lease lost", "ERROR"},
		{"eviction", "WARN"},
		{"Break it? [y/N] ", "INFO"},
	} {
		if recs[i]["msg"] != want.msg || recs[i]["level"] != want.level {
			t.Errorf("record %d: %v, want msg %q level %s", i, recs[i], want.msg, want.level)
		}
	}
	if recs[0]["cmd"] != "migrate" || recs[1]["cmd"] != nil {
		t.Errorf("cmd fields: %v, %v", recs[0]["cmd"], recs[1]["cmd"])
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "--log-format", "json"}, "json"},
		{[]string{"ls", "-log-format=json", "x"}, "json"},
		{[]string{"run", "k", "--", "cmd", "--log-format", "json"}, ""},
		{[]string{"run", "--log-format", "text", "k"}, "text"},
	} {
		if got := logFormatArg(c.args); got != c.want {
			t.Errorf("logFormatArg(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// dlock help logging documents the schema.
func TestHelpLogging(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"help", "logging"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("dlock help logging: exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"time", "level", "msg", "cmd", "key", "err", "hint", "ERROR", "WARN", "INFO"} {
		if !strings.Contains(stdout.String(), "  "+want) && !strings.Contains(stdout.String(), want+" ") {
			t.Errorf("dlock help logging does not mention %q", want)
		}
	}
	stdout.Reset()
	dispatch([]string{"help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "dlock help logging") {
		t.Errorf("dlock help does not point to dlock help logging")
	}
}
