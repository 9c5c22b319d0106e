//go:build unix

package main

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
)

// The CLI refuses mem:// (a lock that lives in one dlock process protects
// nothing between two of them), also nested in a migrate:// DSN and from
// $DLOCK_DSN, unless --allow-mem; the help says so.
func TestMemRefused(t *testing.T) {
	t.Parallel()
	nested := "migrate://?from=" + url.QueryEscape("mem://x") + "&to=" + url.QueryEscape("etcd://127.0.0.1:1")
	const want = "mem:// is an in-process lock"
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"run", "--dsn", "mem://x", "k", "--", "echo", "ran"}},
		{[]string{"DLOCK_DSN=mem://x"}, []string{"run", "k", "--", "echo", "ran"}},
		{nil, []string{"run", "--dsn", nested, "k", "--", "echo", "ran"}},
		{nil, []string{"lock", "--dsn", "mem://x", "k"}},
		{nil, []string{"elect", "--dsn", "mem://x", "k", "--", "echo", "ran"}},
		{nil, []string{"migrate", "dsn", "--from", "mem://x", "--to", "etcd://127.0.0.1:1"}},
		{nil, []string{"migrate", "switch-tokens", "--from", "mem://x", "--to", "etcd://127.0.0.1:1", "--base", "9"}},
		// A new process's in-process store is empty: nothing to show or break.
		{nil, []string{"ls", "--dsn", "mem://x"}},
		{nil, []string{"inspect", "--dsn", "mem://x", "k"}},
		{nil, []string{"break", "--dsn", "mem://x", "--yes", "k"}},
		{nil, []string{"leader", "--dsn", "mem://x", "k"}},
	} {
		r := runCLI(t, c.env, c.args...)
		r.expectCode(t, exitUsage)
		if !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "protects nothing between") || r.stdout != "" {
			t.Errorf("dlock %q: stdout %q, stderr lacks %q:\n%s", c.args, r.stdout, want, r.stderr)
		}
		// Only the subcommands that have the flag offer it.
		hasFlag := c.args[0] == "run" || c.args[0] == "lock" || c.args[0] == "elect"
		if strings.Contains(r.stderr, "--allow-mem") != hasFlag {
			t.Errorf("dlock %q: mentions --allow-mem: %v, want %v:\n%s", c.args, !hasFlag, hasFlag, r.stderr)
		}
	}

	// --allow-mem: for demos, within one command.
	r := runCLI(t, nil, "run", "--allow-mem", "--dsn", "mem://x", "k", "--", "echo", "ran")
	r.expectCode(t, 0)
	if r.stdout != "ran\n" {
		t.Errorf("run --allow-mem: stdout %q", r.stdout)
	}

	for _, args := range [][]string{{"help"}, {"help", "run"}, {"help", "lock"}, {"help", "elect"}} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(args, &stdout, &stderr); code != 0 {
			t.Fatalf("dlock %q: status %d: %s", args, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "--allow-mem") {
			t.Errorf("dlock %q does not mention --allow-mem:\n%s", args, stdout.String())
		}
		if strings.Contains(stdout.String(), "for trying things out") {
			t.Errorf("dlock %q still offers mem:// for trying things out:\n%s", args, stdout.String())
		}
	}
}
