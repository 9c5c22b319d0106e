package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testenv"
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
