package main

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testenv"
)

// TestNoPasswordPrinted runs every subcommand that prints a DSN (migrate dsn,
// check, bench) or a backend's identity or errors (the others), with DSNs
// holding a distinctive password, against live servers and unreachable ones:
// the password appears neither on standard output nor on standard error, nor
// in bench's report. Only migrate dsn --show-passwords prints it.
func TestNoPasswordPrinted(t *testing.T) {
	const pw = "Pw-9d2c71e4"
	// A Redis user of its own: the default user stays open for testenv.
	r := testenv.StartRedis(t, testenv.WithRedisArgs("--user", "app", "on", ">"+pw, "~*", "&*", "+@all"))
	z := testenv.StartZooKeeper(t)
	redisDSN := "redis://app:" + pw + "@" + r.Addr() + "/0?prefix=redact:"
	zkDSN := "zk://u:" + pw + "@" + z.Addr() + "/redact?session=4s"
	deadDSN := "zk://u:" + pw + "@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/redact?connect=300ms"
	migrating := "migrate://?from=" + url.QueryEscape(redisDSN) + "&to=" + url.QueryEscape(zkDSN)
	report := filepath.Join(t.TempDir(), "report.html")
	checkReport := filepath.Join(t.TempDir(), "check.html")

	for _, tc := range []struct {
		args []string
		env  []string
		code int
	}{
		{args: []string{"migrate", "dsn", "--from", redisDSN, "--to", zkDSN}},
		{args: []string{"migrate", "dsn", "--from", redisDSN, "--to", zkDSN, "--mode", "new"}},
		{args: []string{"migrate", "status", "--to", zkDSN}, code: exitFailure},
		{args: []string{"migrate", "switch-tokens", "--from", redisDSN, "--to", zkDSN}},
		{args: []string{"migrate", "status", "--from", redisDSN, "--to", zkDSN}},
		{args: []string{"migrate", "status", "--from", "redis://:" + pw + "@127.0.0.1:1/0", "--to", zkDSN}, code: exitFailure},
		{args: []string{"migrate", "status", "--to", deadDSN}, code: exitUnavailable},
		{args: []string{"migrate", "switch-tokens", "--from", "redis://app:" + pw + "@127.0.0.1:1/0", "--to", deadDSN}, code: exitUnavailable},
		{args: []string{"check", "--dsn", zkDSN, "--run", "^TryAcquireHeld$"}},
		{args: []string{"check", "--dsn", deadDSN}, code: exitUnavailable},
		{args: []string{"check", "--dsn", zkDSN, "--dsn", redisDSN, "--dsn", deadDSN, "--run", "^TryAcquireHeld$", "-o", "json", "--out", checkReport}, code: exitUnavailable},
		{args: []string{"bench", "--dsn", zkDSN, "--dsn", deadDSN, "--clients", "2", "--duration", "400ms", "--out", report}, code: exitUnavailable},
		{args: []string{"run", "-v", "--dsn", migrating, "k", "--", "true"}},
		{args: []string{"run", "-v", "--log-format", "json", "k", "--", "true"}, env: []string{"DLOCK_DSN=" + zkDSN}},
		{args: []string{"run", "--dsn", deadDSN, "k", "--", "true"}, code: exitUnavailable},
		{args: []string{"elect", "-v", "--dsn", zkDSN, "e", "--", "true"}},
		{args: []string{"elect", "--dsn", deadDSN, "e", "--", "true"}, code: exitUnavailable},
		{args: []string{"leader", "--dsn", zkDSN, "e"}, code: exitFailure},
		{args: []string{"leader", "--dsn", deadDSN, "e"}, code: exitUnavailable},
		{args: []string{"ls", "--dsn", zkDSN}},
		{args: []string{"ls", "--dsn", deadDSN}, code: exitUnavailable},
		{args: []string{"inspect", "--dsn", zkDSN, "k"}, code: exitFailure},
		{args: []string{"inspect", "--dsn", deadDSN, "k"}, code: exitUnavailable},
		{args: []string{"break", "--dsn", zkDSN, "--yes", "k"}, code: exitFailure},
		{args: []string{"break", "--dsn", deadDSN, "--yes", "k"}, code: exitUnavailable},
	} {
		res := runCLI(t, tc.env, tc.args...)
		name := "dlock " + strings.Join(tc.args[:min(2, len(tc.args))], " ")
		if res.code != tc.code {
			t.Errorf("%s: exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", name, res.code, tc.code, res.stdout, res.stderr)
		}
		for stream, out := range map[string]string{"stdout": res.stdout, "stderr": res.stderr} {
			if strings.Contains(out, pw) {
				t.Errorf("%s printed the password on %s:\n%s", strings.Join(tc.args, " "), stream, out)
			}
		}
	}
	if b, err := os.ReadFile(report); err != nil || strings.Contains(string(b), pw) || !strings.Contains(string(b), "xxxxx") {
		t.Errorf("bench's report (%v) shows the password, or no redacted DSN", err)
	}
	if b, err := os.ReadFile(checkReport); err != nil || strings.Contains(string(b), pw) || !strings.Contains(string(b), "xxxxx") {
		t.Errorf("check's report (%v) shows the password, or no redacted DSN", err)
	}

	// By default the DSN's inner DSNs are redacted, and stderr says how to
	// get them whole.
	res := runCLI(t, nil, "migrate", "dsn", "--from", redisDSN, "--to", zkDSN)
	res.expectCode(t, exitOK)
	wantMasked := "migrate://?from=" + url.QueryEscape(strings.Replace(redisDSN, pw, "xxxxx", 1)) + "&to=" + url.QueryEscape(strings.Replace(zkDSN, pw, "xxxxx", 1))
	if got := strings.TrimSpace(res.stdout); got != wantMasked || !strings.Contains(res.stderr, "--show-passwords") {
		t.Errorf("migrate dsn: %q, stderr %q; want %q, and --show-passwords named", got, res.stderr, wantMasked)
	}
	res = runCLI(t, nil, "migrate", "status", "--show-passwords", "--to", zkDSN)
	res.expectCode(t, exitUsage)

	// --show-passwords prints the DSN whole, the one to deploy.
	res = runCLI(t, nil, "migrate", "dsn", "--show-passwords", "--from", redisDSN, "--to", zkDSN)
	res.expectCode(t, exitOK)
	if got := strings.TrimSpace(res.stdout); got != migrating {
		t.Errorf("migrate dsn --show-passwords: %q, want %q", got, migrating)
	}
}
