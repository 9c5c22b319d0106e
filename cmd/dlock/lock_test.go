//go:build unix

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// tokenLine parses a token printed by dlock lock.
func tokenLine(t *testing.T, line string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(line, 10, 64)
	if err != nil || n == 0 {
		t.Fatalf("dlock lock printed %q, want a positive token", line)
	}
	return n
}

// dlock lock holds the lock until SIGTERM or SIGINT, printing the token (or
// DLOCK_ lines with --env), then releases it at once and exits 0: a waiter
// whose --wait is far shorter than the holder's TTL gets the lock.
func TestLock(t *testing.T) {
	t.Parallel()
	for _, b := range backendDSNs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"DLOCK_DSN=" + b.dsn(t)}
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
				holder := start(t, env, "lock", "--ttl", "2m", "deploy")
				tok := tokenLine(t, holder.nextLine())

				r := runCLI(t, env, "run", "--no-wait", "deploy", "--", "true")
				r.expectCode(t, exitBusy)

				waiter := start(t, env, "run", "--wait", "40s", "deploy", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
				if err := holder.cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				if code := holder.wait(20 * time.Second); code != 0 {
					t.Fatalf("dlock lock after %v: exit status %d, want 0\nstderr:\n%s", sig, code, holder.stderr)
				}
				if next := tokenLine(t, waiter.nextLine()); next <= tok {
					t.Errorf("the waiter's token %d is not above the lock's %d", next, tok)
				}
				if code := waiter.wait(20 * time.Second); code != 0 {
					t.Fatalf("waiter: exit status %d\nstderr:\n%s", code, waiter.stderr)
				}
			}

			// --env: lines for eval, with the key quoted for the shell.
			holder := start(t, env, "lock", "--env", "it's a key")
			var out bytes.Buffer
			for range 2 {
				out.WriteString(holder.nextLine() + "\n")
			}
			script := filepath.Join(t.TempDir(), "env.sh")
			if err := os.WriteFile(script, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := exec.Command("sh", "-c", `eval "$(cat "$0")"; printf '%s|%s' "$DLOCK_KEY" "$DLOCK_TOKEN"`, script).Output()
			if err != nil {
				t.Fatalf("eval of --env output %q: %v", out.String(), err)
			}
			key, tok, _ := strings.Cut(string(got), "|")
			if key != "it's a key" {
				t.Errorf("eval of --env output %q: DLOCK_KEY %q", out.String(), key)
			}
			tokenLine(t, tok)
			if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := holder.wait(20 * time.Second); code != 0 {
				t.Fatalf("dlock lock --env after SIGTERM: exit status %d\nstderr:\n%s", code, holder.stderr)
			}
			runCLI(t, env, "run", "--no-wait", "it's a key", "--", "true").expectCode(t, 0)
		})
	}
}

// dlock lock exits 76, as run does, when the lease is lost, and says so.
func TestLockLost(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = raw.Close() })
	b := start(t, []string{"DLOCK_DSN=" + srv.URL()}, "lock", "--ttl", "1s", "lost")
	tokenLine(t, b.nextLine())
	if n, err := raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, "lost")).Result(); err != nil || n != 1 {
		t.Fatalf("DEL the lock key: %d, %v", n, err)
	}
	if code := b.wait(20 * time.Second); code != exitLost {
		t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
	}
	if stderr := b.stderr.String(); !strings.Contains(stderr, `dlock: lost the lock "lost"`) {
		t.Errorf("stderr does not report the loss:\n%s", stderr)
	}
}

// --shared takes a read lock (package rwlock): two readers hold it at once,
// with run and with lock, and a writer waits until both are gone; a backend
// without shared locks of its own refuses it.
func TestShared(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return testenv.StartRedis(t).URL() }},
		{"etcd", func(t *testing.T) string { return testenv.StartEtcd(t).URL() + "/locks" }},
		{"postgres", func(t *testing.T) string { return testenv.StartPostgres(t).URL() }},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"DLOCK_DSN=" + b.dsn(t)}
			r1 := start(t, env, "lock", "--shared", "config")
			tokenLine(t, r1.nextLine())
			r2 := start(t, env, "run", "--shared", "--no-wait", "config", "--", "sh", "-c", "echo reading; exec sleep 60")
			r2.expectLine("reading")
			r := runCLI(t, env, "run", "--shared", "--no-wait", "config", "--", "true")
			r.expectCode(t, 0) // a third reader

			r = runCLI(t, env, "run", "--no-wait", "config", "--", "echo", "wrote")
			r.expectCode(t, exitBusy)
			if r.stdout != "" {
				t.Fatalf("a writer ran beside readers: %q", r.stdout)
			}

			// A waiting writer runs only once both readers are gone: the
			// marker appears just before the last one is told to go.
			marker := filepath.Join(t.TempDir(), "last-reader-going")
			w := start(t, env, "run", "--wait", "40s", "config", "--", "sh", "-c", `test -e "$0" && echo after || echo before`, marker)
			if err := r1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := r1.wait(20 * time.Second); code != 0 {
				t.Fatalf("reader 1 after SIGTERM: exit %d\n%s", code, r1.stderr)
			}
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := r2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if got := w.nextLine(); got != "after" {
				t.Errorf("the writer ran %s the last reader left", got)
			}
			if code := w.wait(20 * time.Second); code != 0 {
				t.Errorf("writer: exit %d\n%s", code, w.stderr)
			}
			r2.wait(20 * time.Second)
		})
	}

	// A backend without shared locks of its own (Redis in fair mode) refuses
	// --shared.
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL() + "?fair=true"}
	for _, args := range [][]string{{"run", "--shared", "config", "--", "echo", "read"}, {"lock", "--shared", "config"}} {
		r := runCLI(t, env, args...)
		r.expectCode(t, exitUsage)
		if r.stdout != "" || !strings.Contains(r.stderr, "no shared locks") {
			t.Errorf("dlock %q on Redis in fair mode: stdout %q, stderr %q", args, r.stdout, r.stderr)
		}
	}
}
