package main

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/migrate"
)

// TestMigrate runs a Redis → etcd migration through the dlock binary, as
// docs/MIGRATING.md describes it: the migrating DSN, the switch, the
// new-only DSN.
func TestMigrate(t *testing.T) {
	r := testenv.StartRedis(t)
	e := testenv.StartEtcd(t)
	from, to := r.URL()+"?prefix=mig:", e.URL()+"/locks"

	token := func(dsn string) uint64 {
		t.Helper()
		res := runCLI(t, nil, "run", "--dsn", dsn, "jobs/nightly", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		res.expectCode(t, exitOK)
		n, err := strconv.ParseUint(strings.TrimSpace(res.stdout), 10, 64)
		if err != nil {
			t.Fatalf("token %q: %v", res.stdout, err)
		}
		return n
	}

	res := runCLI(t, nil, "migrate", "status", "--to", to)
	res.expectCode(t, exitFailure)
	if !strings.Contains(res.stdout, "not switched") {
		t.Errorf("status before the switch: %q", res.stdout)
	}

	res = runCLI(t, nil, "migrate", "dsn", "--from", from, "--to", to)
	res.expectCode(t, exitOK)
	migrating := strings.TrimSpace(res.stdout)
	res = runCLI(t, nil, "migrate", "dsn", "--from", from, "--to", to, "--mode", "new")
	res.expectCode(t, exitOK)
	newOnly := strings.TrimSpace(res.stdout)
	if !strings.HasPrefix(migrating, "migrate://?from=") || newOnly != migrating+"&mode=new" {
		t.Fatalf("dsn: %q and %q", migrating, newOnly)
	}

	// Before the switch: Redis tokens, for Redis-only and migrating clients
	// alike; new-only clients are refused.
	t1 := token(from)
	t2 := token(migrating)
	if t2 <= t1 {
		t.Errorf("migrating token %d not above the Redis token %d", t2, t1)
	}
	res = runCLI(t, nil, "run", "--dsn", newOnly, "k", "--", "true")
	res.expectCode(t, exitUnavailable)
	if !strings.Contains(res.stderr, "not switched") {
		t.Errorf("new-only before the switch: %q", res.stderr)
	}

	res = runCLI(t, nil, "migrate", "switch-tokens", "--from", from, "--to", to)
	res.expectCode(t, exitOK)
	if !strings.Contains(res.stdout, "switched: tokens now come from the new backend") {
		t.Errorf("switch-tokens: %q", res.stdout)
	}
	res = runCLI(t, nil, "migrate", "switch-tokens", "--from", from, "--to", to)
	res.expectCode(t, exitOK)
	if !strings.Contains(res.stdout, "already switched") {
		t.Errorf("second switch-tokens: %q", res.stdout)
	}
	res = runCLI(t, nil, "migrate", "status", "--to", to, "--from", from)
	res.expectCode(t, exitOK)
	if !strings.Contains(res.stdout, "old backend: redis://"+r.Addr()+"/0?prefix=mig%3A") {
		t.Errorf("status: %q", res.stdout)
	}

	// After the switch: mapped tokens, above every Redis one, from migrating
	// and new-only clients alike.
	t3 := token(migrating)
	t4 := token(newOnly)
	if t3 <= t2 || t4 <= t3 {
		t.Errorf("tokens %d, %d, %d, %d: not increasing", t1, t2, t3, t4)
	}

	// Refusals.
	res = runCLI(t, nil, "migrate", "switch-tokens", "--from", "redis://127.0.0.1:1/0", "--to", to)
	res.expectCode(t, exitFailure)
	if !strings.Contains(res.stderr, "does not match") {
		t.Errorf("switch-tokens for another old backend: %q", res.stderr)
	}
	res = runCLI(t, nil, "migrate", "status", "--to", to, "--from", "redis://127.0.0.1:1/0")
	res.expectCode(t, exitFailure)
	res = runCLI(t, nil, "migrate", "switch-tokens", "--from", "postgres://u:s3cret@127.0.0.1:1/db", "--to", to)
	res.expectCode(t, exitUsage)
	res = runCLI(t, nil, "migrate", "status", "--to", "etcd://u:s3cret@127.0.0.1:1/x?dial-timeout=300ms")
	res.expectCode(t, exitUnavailable)
	if strings.Contains(res.stdout+res.stderr, "s3cret") {
		t.Errorf("password printed: %q", res.stderr)
	}
}

func TestMigrateUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"migrate"}, exitUsage, "switch-tokens"},
		{[]string{"migrate", "frob"}, exitUsage, `unknown subcommand "frob"`},
		{[]string{"migrate", "switch-tokens", "--to", "etcd://h"}, exitUsage, "needs --from"},
		{[]string{"migrate", "status"}, exitUsage, "needs --to"},
		{[]string{"migrate", "dsn", "--from", "redis://h", "--to", "etcd://h", "--mode", "x"}, exitUsage, `--mode "x"`},
		{[]string{"migrate", "switch-tokens", "--from", "redis://h", "--to", "etcd://h", "--base", "-1"}, exitUsage, "--base"},
		{[]string{"help", "migrate"}, exitOK, "Exit statuses"},
	} {
		res := runCLI(t, nil, c.args...)
		if res.code != c.code || !strings.Contains(res.stdout+res.stderr, c.want) {
			t.Errorf("dlock %s: exit %d, %q %q; want exit %d mentioning %q", strings.Join(c.args, " "), res.code, res.stdout, res.stderr, c.code, c.want)
		}
	}
}

// migrate dsn refuses what dlock run would refuse of the DSN it prints, and
// accepts what run accepts: each target is tried both ways on real servers.
// It never prints a password but with --show-passwords.
func TestMigrateDSNRefusesWhatRunRefuses(t *testing.T) {
	t.Parallel()
	from := testenv.StartRedis(t).URL() + "?prefix=migdsn:"
	etcdURL := testenv.StartEtcd(t).URL()
	pgURL := testenv.StartPostgres(t).URL()
	for _, c := range []struct {
		name, from, to string
		refused        bool
		want           string // in migrate dsn's error
	}{
		{"etcd", from, etcdURL + "/locks", false, ""},
		{"postgres", from, pgURL, true, "the new backend must be etcd (etcd://, etcds://) or ZooKeeper (zk://), not postgres://"},
		{"redis to redis", from, from, true, "not redis://"},
		{"ttl on the new DSN", from, etcdURL + "/locks?ttl=5s", true, "put ttl=5s on the migrate:// DSN"},
		{"unknown scheme", from, "nope://127.0.0.1:1", true, `unknown DSN scheme "nope"`},
		{"unknown old scheme", "nope://127.0.0.1:1", etcdURL + "/locks", true, `unknown DSN scheme "nope"`},
		{"nested", from, migrate.DSN(from, etcdURL, ""), true, "a migrate:// DSN cannot nest another"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, "run", "--dsn", migrate.DSN(c.from, c.to, ""), "k", "--", "true")
			if runRefused := r.code == exitUsage; runRefused != c.refused {
				t.Fatalf("dlock run refused the DSN: %v, want %v (exit %d)\n%s", runRefused, c.refused, r.code, r.stderr)
			}
			r = runCLI(t, nil, "migrate", "dsn", "--from", c.from, "--to", c.to)
			if !c.refused {
				r.expectCode(t, exitOK)
				if got, want := strings.TrimSpace(r.stdout), migrate.DSN(c.from, c.to, ""); got != want {
					t.Errorf("migrate dsn printed %q, want %q", got, want)
				}
				return
			}
			r.expectCode(t, exitUsage)
			if r.stdout != "" || !strings.Contains(r.stderr, c.want) {
				t.Errorf("migrate dsn: stdout %q, stderr lacks %q:\n%s", r.stdout, c.want, r.stderr)
			}
		})
	}

	// Passwords: in the user info and in a parameter, of either DSN.
	secretFrom := "redis://:s3cret-a@127.0.0.1:1/0"
	secretTo := "etcd://u:s3cret-b@127.0.0.1:1/locks?dial-timeout=1s"
	for _, c := range []struct {
		from, to string
		code     int
	}{
		{secretFrom, secretTo, exitOK},
		{secretFrom, "postgres://u:s3cret-b@127.0.0.1:1/db?password=s3cret-c", exitUsage},
		{"redis://127.0.0.1:1/0?password=s3cret-a", "zk://u:s3cret-b@127.0.0.1:1/x", exitOK},
		{"nope://u:s3cret-a@h/", secretTo, exitUsage},
	} {
		r := runCLI(t, nil, "migrate", "dsn", "--from", c.from, "--to", c.to)
		r.expectCode(t, c.code)
		if strings.Contains(r.stdout+r.stderr, "s3cret") {
			t.Errorf("migrate dsn --from %s --to %s printed a password:\n%s%s", c.from, c.to, r.stdout, r.stderr)
		}
		if c.code == exitOK && !strings.Contains(r.stdout, url.QueryEscape("xxxxx")) {
			t.Errorf("migrate dsn did not mask the passwords: %q", r.stdout)
		}
	}
	r := runCLI(t, nil, "migrate", "dsn", "--from", secretFrom, "--to", secretTo, "--show-passwords")
	r.expectCode(t, exitOK)
	if got, want := strings.TrimSpace(r.stdout), migrate.DSN(secretFrom, secretTo, ""); got != want {
		t.Errorf("--show-passwords printed %q, want %q", got, want)
	}
}
