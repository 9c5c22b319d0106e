package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
)

// resultRow matches a row of dlock check's table: test, result, time, note.
var resultRow = regexp.MustCompile(`(?m)^([A-Za-z()/]+) +(PASS|FAIL|SKIP) +(\S+)(?: +(.*))?$`)

// checkRows returns dlock check's table as test name → [result, note].
func checkRows(stdout string) map[string][2]string {
	rows := map[string][2]string{}
	for _, m := range resultRow.FindAllStringSubmatch(stdout, -1) {
		rows[m[1]] = [2]string{m[2], m[4]}
	}
	return rows
}

func TestCheckRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	r := runCLI(t, nil, "check", "--dsn", srv.URL())
	r.expectCode(t, 0)
	for _, want := range []string{
		`^dlock check ` + regexp.QuoteMeta(srv.URL()) + `$`,
		`^fencing +strict +tokens strictly increase`,
		`^Shortest TTL the suite uses: 1s; keys under the prefix "dlock:check-[0-9a-f]{8}:"$`,
		`^Cleanup: deleted \d+ keys`,
		`^shared +yes +locks can be held shared`,
		`^native-semaphore +yes +semaphores in the backend's own layout`,
		`^PASS: \d+ passed, \d+ skipped, 0 failed in `,
	} {
		if !regexp.MustCompile(`(?m)` + want).MatchString(r.stdout) {
			t.Errorf("output does not match %s:\n%s", want, r.stdout)
		}
	}
	rows := checkRows(r.stdout)
	// The summary counts the table's rows. Skipped on Redis, with their
	// reasons: FIFO, ErrorsHideSecrets (check does not log in with a wrong
	// password) and Break/HandOff (only a harness with a Break hook runs it);
	// the Shared groups run (the driver claims shared locks).
	var passed, skipped int
	for _, row := range rows {
		switch row[0] {
		case "PASS":
			passed++
		case "SKIP":
			skipped++
		}
	}
	if want := fmt.Sprintf("PASS: %d passed, %d skipped, 0 failed in ", passed, skipped); !strings.Contains(r.stdout, want) {
		t.Errorf("the summary does not count the table's %d PASS and %d SKIP rows (%q):\n%s", passed, skipped, want, r.stdout)
	}
	if skipped != 3 || rows["Break/HandOff"][0] != "SKIP" {
		t.Errorf("%d groups skipped, want 3: FIFO, ErrorsHideSecrets and Break/HandOff:\n%s", skipped, r.stdout)
	}
	// Redis claims counted semaphores (its own layout): the NativeSemaphore group and
	// the Semaphore groups run through it, SemaphoreFenced with a permit's
	// slot forgotten by the admin client.
	for _, name := range []string{"NativeSemaphore", "SemaphoreFenced", "SemaphoreHolderVanishes"} {
		if rows[name][0] != "PASS" {
			t.Errorf("%s: %q, want PASS\n%s", name, rows[name], r.stdout)
		}
	}
	// On Redis the tests that make the server forget a holder run too.
	for _, name := range []string{"MutualExclusion", "TokensIncrease", "StaleLeaseCannotTouchNewHolder", "ExpireEndsLease", "PausedHolderFenced"} {
		if rows[name][0] != "PASS" {
			t.Errorf("%s: %q, want PASS\n%s", name, rows[name], r.stdout)
		}
	}
	if rows["FIFO"] != [2]string{"SKIP", "backend does not claim FIFO waiting"} {
		t.Errorf("FIFO: %q, want a skip with its reason", rows["FIFO"])
	}
	// Redis claims shared locks (its own layout): the Shared groups run.
	for _, name := range []string{"Shared", "SharedHolderVanishes", "SharedCancel"} {
		if rows[name][0] != "PASS" {
			t.Errorf("%s: %q, want PASS\n%s", name, rows[name], r.stdout)
		}
	}
	if rows["ErrorsHideSecrets"] != [2]string{"SKIP", "would log in to a live deployment with a wrong password"} {
		t.Errorf("ErrorsHideSecrets: %q, want a skip with its reason", rows["ErrorsHideSecrets"])
	}
	if !strings.Contains(r.stderr, "dlock: PASS  MutualExclusion") {
		t.Errorf("no progress on stderr:\n%s", r.stderr)
	}

	// Nothing is left on the server: the fence counters were deleted.
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	if keys, err := raw.Keys(context.Background(), "*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("keys left on the server: %q, %v", keys, err)
	}
}

func TestCheckSkipAndFailure(t *testing.T) {
	t.Parallel()
	t.Run("skip", func(t *testing.T) {
		t.Parallel()
		// mem:// lives in the suite's process; dlock check makes it forget a
		// holder with dlock.Break. It does not log in with a wrong password.
		r := runCLI(t, nil, "check", "--dsn", "mem://check", "--run", "^(ExpireEndsLease|ErrorsHideSecrets)$")
		r.expectCode(t, 0)
		rows := checkRows(r.stdout)
		if rows["ExpireEndsLease"][0] != "PASS" || rows["ErrorsHideSecrets"][0] != "SKIP" ||
			!strings.Contains(rows["ErrorsHideSecrets"][1], "live deployment") || len(rows) != 2 {
			t.Errorf("rows %q\n%s", rows, r.stdout)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		// AutoRenew holds a lock for 5 TTLs (5s): the timeout stops it.
		r := runCLI(t, nil, "check", "--dsn", "mem://check", "--run", "^AutoRenew$", "--timeout", "3s")
		r.expectCode(t, exitFailure)
		if rows := checkRows(r.stdout); rows["AutoRenew"] != [2]string{"FAIL", "timed out after 3s"} {
			t.Errorf("AutoRenew: %q, want FAIL, timed out\n%s", rows["AutoRenew"], r.stdout)
		}
		if !strings.Contains(r.stdout, "FAIL: 0 passed, 0 skipped, 1 failed") || strings.Contains(r.stdout+r.stderr, "goroutine ") {
			t.Errorf("stdout:\n%s", r.stdout)
		}
		if !strings.Contains(r.stderr, "dlock: mem://check: timed out after 3s in AutoRenew\n") {
			t.Errorf("stderr lacks the timeout's line:\n%s", r.stderr)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "check", "--dsn", "redis://:sekret@127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)))
		r.expectCode(t, exitUnavailable)
		if !strings.Contains(r.stderr, "dlock: cannot open redis://:xxxxx@127.0.0.1:") || strings.Contains(r.stderr, "sekret") {
			t.Errorf("stderr:\n%s", r.stderr)
		}
	})
}

func TestCheckUsage(t *testing.T) {
	t.Setenv("DLOCK_DSN", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"check"}, "no backend"},
		{[]string{"check", "--dsn", "mem://x", "extra"}, `unexpected argument "extra"`},
		{[]string{"check", "--dsn", "mem://x", "--run", "("}, "--run: error parsing regexp"},
		{[]string{"check", "--dsn", "mem://x", "--timeout", "0s"}, "--timeout must be a positive duration"},
	} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(c.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: status %d, stderr %q; want %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}

func TestOutputParser(t *testing.T) {
	// Output of a test binary run with -test.v=test2json.
	out := "\x16=== RUN   Conformance\n" +
		"    conformance.go:39: capabilities: fencing=strict\n" +
		"\x16=== RUN   Conformance/A\n" +
		"    conformance.go:10: first line\n" +
		"        continued\n" +
		"\x16--- PASS: Conformance/A (0.25s)\n" +
		"\x16=== NAME  Conformance\n" +
		"\x16=== RUN   Conformance/B\n" +
		"    conformance.go:20: backend does not claim FIFO waiting\n" +
		"\x16--- SKIP: Conformance/B (0.00s)\n" +
		"\x16=== NAME  Conformance\n" +
		"\x16=== RUN   Conformance/C\n" +
		"    conformance.go:30: --- FAIL: not a frame\n" +
		"    conformance.go:31: Acquire: boom\n" +
		"\x16--- FAIL: Conformance/C (1.50s)\n" +
		"\x16=== NAME  Conformance\n" +
		"\x16--- FAIL: Conformance (1.75s)\n" +
		"\x16FAIL\n"
	var ended []string
	p := &outputParser{onResult: func(r testResult) { ended = append(ended, r.Name) }}
	for l := range strings.Lines(out) {
		p.line(strings.TrimSuffix(l, "\n"))
	}
	if !p.finished {
		t.Error("the final FAIL line was not seen")
	}
	if want := []string{"A", "B", "C", ""}; strings.Join(ended, ",") != strings.Join(want, ",") {
		t.Errorf("tests ended: %q, want %q", ended, want)
	}
	want := []testResult{
		{"A", "PASS", 250 * time.Millisecond, []string{"first line", "    continued"}},
		{"B", "SKIP", 0, []string{"backend does not claim FIFO waiting"}},
		{"C", "FAIL", 1500 * time.Millisecond, []string{"--- FAIL: not a frame", "Acquire: boom"}},
	}
	for i, w := range want {
		g := p.results[i]
		if g.Name != w.Name || g.Status != w.Status || g.Elapsed != w.Elapsed || strings.Join(g.Output, "|") != strings.Join(w.Output, "|") {
			t.Errorf("result %d = %+v, want %+v", i, g, w)
		}
	}
	if n := p.results[1].note(); n != "backend does not claim FIFO waiting" {
		t.Errorf("skip note %q", n)
	}
	if n := p.results[2].note(); n != "--- FAIL: not a frame" {
		t.Errorf("failure note %q", n)
	}

	var table bytes.Buffer
	if failed := printResults(&table, p.results, nil); failed != 1 {
		t.Errorf("printResults counted %d failures, want 1", failed)
	}
	for _, want := range []string{"A     PASS    0.25s\n", "\n--- C\n    --- FAIL: not a frame\n    Acquire: boom\n"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

func TestCheckPlan(t *testing.T) {
	p, err := newCheckPlan("redis://u:sekret@h:6379/0?prefix=app:&ttl=5s", "0123abcd")
	if err != nil {
		t.Fatal(err)
	}
	if p.prefix != "app:check-0123abcd:" || !p.admin || strings.Contains(p.shown, "sekret") ||
		!strings.Contains(p.dsn, "prefix=app%3Acheck-0123abcd%3A") || !strings.Contains(p.dsn, "ttl=5s") || !strings.Contains(p.dsn, "sekret") {
		t.Errorf("redis plan %+v", p)
	}
	p, _ = newCheckPlan("redlock://h1,h2,h3", "0123abcd")
	if p.prefix != "dlock:check-0123abcd:" || p.admin || !strings.Contains(p.remain, "dlock:check-0123abcd:*") {
		t.Errorf("redlock plan %+v", p)
	}
	p, _ = newCheckPlan("etcd://h1:2379/locks", "0123abcd")
	if p.prefix != "/locks/check-0123abcd" || p.dsn != "etcd://h1:2379/locks/check-0123abcd" || p.remain != "" {
		t.Errorf("etcd plan %+v", p)
	}
	p, _ = newCheckPlan("etcd://h1:2379", "0123abcd")
	if p.dsn != "etcd://h1:2379/dlock/check-0123abcd" {
		t.Errorf("etcd plan without a path %+v", p)
	}
	p, _ = newCheckPlan("postgres://u:sekret@h/db?table=locks.fence&sslmode=disable", "0123abcd")
	if p.table != "locks.fence_check_0123abcd" || !strings.Contains(p.dsn, "table=locks.fence_check_0123abcd") ||
		!strings.Contains(p.dsn, "sslmode=disable") || strings.Contains(p.shown, "sekret") || p.remain != "" {
		t.Errorf("postgres plan %+v", p)
	}
}

func TestRedisAdminIgnoresDriverParameters(t *testing.T) {
	a, err := newRedisAdmin("redis://u:pw@127.0.0.1:1/2?prefix=app:&ttl=5s&poll=1s&checks=off&some_future_param=1&dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if o := a.client.Options(); a.prefix != "app:" || o.DB != 2 || o.Password != "pw" || o.DialTimeout != time.Second {
		t.Errorf("prefix %q, options %+v", a.prefix, o)
	}
	if _, err := newRedisAdmin("redis://u:pw@127.0.0.1:1/x"); err == nil || strings.Contains(err.Error(), "pw") {
		t.Errorf("bad DB: %v", err)
	}
	if got := globEscape(`a*b?[c]\d`); got != `a\*b\?\[c\]\\d` {
		t.Errorf("globEscape = %q", got)
	}
}
