package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// runCLIInput is runCLI with input on the command's stdin.
func runCLIInput(t *testing.T, env []string, input string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, dlockBin, args...)
	cmd.Env = cliEnv(env...)
	cmd.Stdin = strings.NewReader(input)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("dlock %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// TestAdminCommands: dlock ls, inspect and break, as an operator runs them
// against a lock another process holds (on etcd).
func TestAdminCommands(t *testing.T) {
	t.Parallel()
	dsn := testenv.StartEtcd(t).URL() + "/admin"
	env := []string{"DLOCK_DSN=" + dsn}
	ctx := context.Background()
	l, err := dlock.Open(ctx, dsn, dlock.WithLabel("nightly-report@host7"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	tok := lease.Token().String()

	r := runCLI(t, env, "ls", "jobs/")
	r.expectCode(t, 0)
	if !strings.Contains(r.stdout, "jobs/nightly") || !strings.Contains(r.stdout, "nightly-report@host7") || !strings.Contains(r.stdout, tok) {
		t.Errorf("dlock ls does not show the holder:\n%s", r.stdout)
	}
	if r := runCLI(t, env, "ls", "other/"); strings.Contains(r.stdout, "jobs/nightly") {
		t.Errorf("dlock ls other/ lists jobs/nightly:\n%s", r.stdout)
	}

	r = runCLI(t, env, "inspect", "jobs/nightly")
	r.expectCode(t, 0)
	for _, want := range []string{"held:", "yes", "token:", tok, "nightly-report@host7", "waiters:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlock inspect does not show %q:\n%s", want, r.stdout)
		}
	}
	runCLI(t, env, "inspect", "jobs/free").expectCode(t, 1)
	runCLI(t, env, "inspect").expectCode(t, 64)

	// Not confirmed: nothing is broken.
	r = runCLIInput(t, env, "n\n", "break", "jobs/nightly")
	r.expectCode(t, 1)
	if !strings.Contains(r.stderr, "nightly-report@host7") || !strings.Contains(r.stderr, "[y/N]") {
		t.Errorf("dlock break did not show the holder and ask:\n%s", r.stderr)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease after a declined break: %v", err)
	}

	// The same under --log-format json: the holder and the question are
	// records too.
	r = runCLIInput(t, env, "n\n", "break", "--log-format", "json", "jobs/nightly")
	r.expectCode(t, 1)
	if recs := jsonRecords(t, "break --log-format json", r.stderr); len(recs) != 3 || recs[0]["label"] != "nightly-report@host7" || !strings.HasSuffix(recs[1]["msg"].(string), "[y/N] ") || recs[2]["msg"] != "not broken" {
		t.Errorf("dlock break --log-format json, declined:\n%s", r.stderr)
	}

	r = runCLIInput(t, env, "y\n", "break", "jobs/nightly")
	r.expectCode(t, 0)
	if !strings.Contains(r.stdout, "broke:") || !strings.Contains(r.stdout, tok) {
		t.Errorf("dlock break did not say what it broke:\n%s", r.stdout)
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the broken lease did not end within 10s")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("broken lease: %v, want ErrLeaseLost", lease.Err())
	}
	runCLI(t, env, "break", "--yes", "jobs/nightly").expectCode(t, 1) // nobody holds it now
}

// inspect says how many hold a key shared.
func TestPrintInfoShared(t *testing.T) {
	var b bytes.Buffer
	printInfo(&b, dlock.LockInfo{Key: "config", Held: true, Shared: 3, Token: 9, Waiters: 1})
	if !strings.Contains(b.String(), "shared by 3") || !strings.Contains(b.String(), "9\n") {
		t.Errorf("inspect of a key held shared by 3:\n%s", b.String())
	}
	b.Reset()
	printInfo(&b, dlock.LockInfo{Key: "config", Held: true, Token: 9, Waiters: 1})
	if strings.Contains(b.String(), "shared") {
		t.Errorf("inspect of a key held exclusively:\n%s", b.String())
	}
}
