//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

func TestRunPassesTokenKeyAndStatus(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	token := func(code int) uint64 {
		t.Helper()
		r := runCLI(t, env, "run", "jobs/nightly", "--", "sh", "-c", fmt.Sprintf(`echo "$DLOCK_KEY $DLOCK_TOKEN"; exit %d`, code))
		r.expectCode(t, code)
		key, tok, _ := strings.Cut(strings.TrimSpace(r.stdout), " ")
		if key != "jobs/nightly" {
			t.Fatalf("DLOCK_KEY = %q, want jobs/nightly", key)
		}
		n, err := strconv.ParseUint(tok, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("DLOCK_TOKEN = %q, want a positive number", tok)
		}
		return n
	}
	first := token(7)
	if second := token(0); second <= first {
		t.Errorf("second run's token %d is not above the first's %d", second, first)
	}

	// A command killed by a signal: 128+N, as a shell reports it.
	runCLI(t, env, "run", "k", "--", "sh", "-c", "kill -KILL $$").expectCode(t, 128+int(syscall.SIGKILL))

	// Flags may also come between KEY and --; -v reports the token.
	r := runCLI(t, env, "run", "k", "--ttl", "5s", "-v", "--", "true")
	r.expectCode(t, 0)
	if !strings.Contains(r.stderr, `dlock: acquired "k" with token`) || !strings.Contains(r.stderr, `dlock: released "k"`) {
		t.Errorf("-v did not report acquire and release:\n%s", r.stderr)
	}
}

func TestRunBusy(t *testing.T) {
	t.Parallel()
	backends := []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return testenv.StartRedis(t).URL() }},
		{"etcd", func(t *testing.T) string { return testenv.StartEtcd(t).URL() + "/locks" }},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"DLOCK_DSN=" + b.dsn(t)}
			holder := start(t, env, "run", "busy", "--", "sh", "-c", "echo held; exec sleep 60")
			holder.expectLine("held")

			r := runCLI(t, env, "run", "--no-wait", "busy", "--", "echo", "ran")
			r.expectCode(t, exitBusy)
			if r.stdout != "" || !strings.Contains(r.stderr, `dlock: the lock "busy" is held by another owner (--no-wait)`) {
				t.Errorf("--no-wait on a held lock: stdout %q, stderr %q", r.stdout, r.stderr)
			}

			r = runCLI(t, env, "run", "--wait", "300ms", "busy", "--", "echo", "ran")
			r.expectCode(t, exitBusy)
			if r.stdout != "" || !strings.Contains(r.stderr, "after waiting 300ms") || r.took < 300*time.Millisecond {
				t.Errorf("--wait 300ms on a held lock took %v: stdout %q, stderr %q", r.took, r.stdout, r.stderr)
			}

			// A waiter interrupted by a signal exits 128+N and leaves nothing behind.
			waiter := start(t, env, "run", "busy", "--", "echo", "ran")
			time.Sleep(300 * time.Millisecond) // let it start waiting; if it has not, the signal stops its connecting
			if err := waiter.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := waiter.wait(10 * time.Second); code != 128+int(syscall.SIGTERM) {
				t.Errorf("waiter interrupted by SIGTERM: exit status %d, want %d\nstderr:\n%s", code, 128+int(syscall.SIGTERM), waiter.stderr)
			}

			// Another waiter gets the lock once the holder is gone.
			waiter = start(t, env, "run", "busy", "--", "echo", "ran")
			if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := holder.wait(10 * time.Second); code != 128+int(syscall.SIGTERM) {
				t.Errorf("holder after SIGTERM: exit status %d, want %d (sleep killed by the forwarded signal)\nstderr:\n%s",
					code, 128+int(syscall.SIGTERM), holder.stderr)
			}
			waiter.expectLine("ran")
			if code := waiter.wait(10 * time.Second); code != 0 {
				t.Errorf("waiter: exit status %d\nstderr:\n%s", code, waiter.stderr)
			}
		})
	}
}

func TestRunLeaseLost(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	env := []string{"DLOCK_DSN=" + srv.URL()}
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = raw.Close() })
	forget := func(t *testing.T, key string) {
		t.Helper()
		if n, err := raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, key)).Result(); err != nil || n != 1 {
			t.Fatalf("DEL the lock key of %q: %d, %v", key, n, err)
		}
	}

	t.Run("SIGTERM", func(t *testing.T) {
		t.Parallel()
		b := start(t, env, "run", "--ttl", "1s", "lost-term", "--", "sh", "-c", "echo started; exec sleep 60")
		b.expectLine("started")
		forget(t, "lost-term")
		if code := b.wait(20 * time.Second); code != exitLost {
			t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
		}
		stderr := b.stderr.String()
		for _, want := range []string{`dlock: lost the lock "lost-term"`, "dlock: error: lease lost (backend=redis, key=lost-term", "SIGTERM now, SIGKILL in 10s", "may not have run alone"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
		if strings.Contains(stderr, "still running") {
			t.Errorf("SIGKILL sent to a command that stopped on SIGTERM:\n%s", stderr)
		}
	})

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		b := start(t, env, "run", "--ttl", "1s", "--log-format", "json", "lost-json", "--", "sh", "-c", "echo started; exec sleep 60")
		b.expectLine("started")
		forget(t, "lost-json")
		if code := b.wait(20 * time.Second); code != exitLost {
			t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
		}
		var lost map[string]any
		for _, line := range strings.Split(b.stderr.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "dlock: lease lost" {
				lost = rec
			}
		}
		if lost == nil || lost["level"] != "ERROR" || lost["key"] != "lost-json" || lost["cause"] != "backend-reported" || lost["backend"] != "redis" {
			t.Errorf("no JSON record of the lost lease with its key, backend and cause:\n%s", b.stderr)
		}
	})

	t.Run("SIGKILL", func(t *testing.T) {
		t.Parallel()
		// The command and a process it started ignore SIGTERM.
		script := `trap "" TERM; sleep 60 & echo $!; echo started; while :; do sleep 0.1; done`
		b := start(t, env, "run", "--ttl", "1s", "--grace", "500ms", "lost-kill", "--", "sh", "-c", script)
		grandchild, err := strconv.Atoi(b.nextLine())
		if err != nil {
			t.Fatal(err)
		}
		b.expectLine("started")
		forget(t, "lost-kill")
		if code := b.wait(20 * time.Second); code != exitLost {
			t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
		}
		if stderr := b.stderr.String(); !strings.Contains(stderr, "still running 500ms after SIGTERM: SIGKILL") {
			t.Errorf("stderr does not report the SIGKILL:\n%s", stderr)
		}
		waitGone(t, grandchild)
	})
}

// waitGone waits for process pid to be gone, at most 5s. A zombie is gone:
// the process that should reap it may not (PID 1 in a container).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if bytes.Contains(stat, []byte(") Z ")) {
				return
			}
		} else if syscall.Kill(pid, 0) == syscall.ESRCH {
			return
		}
	}
	t.Errorf("process %d, started by the command, survived the loss of the lock", pid)
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		name := signalName(sig)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "marker")
			key := "forward-" + name
			script := fmt.Sprintf(`trap 'echo got %s > "$0"; exit 0' %s; echo ready; while :; do sleep 0.1; done`, name, strings.TrimPrefix(name, "SIG"))
			b := start(t, env, "run", key, "--", "sh", "-c", script, marker)
			b.expectLine("ready")
			if err := b.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := b.wait(10 * time.Second); code != 0 {
				t.Fatalf("exit status %d, want the command's 0\nstderr:\n%s", code, b.stderr)
			}
			got, err := os.ReadFile(marker)
			if err != nil || strings.TrimSpace(string(got)) != "got "+name {
				t.Fatalf("the command did not get %s: marker %q, %v", name, got, err)
			}
			// Released once the command exited.
			runCLI(t, env, "run", "--no-wait", key, "--", "true").expectCode(t, 0)
		})
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	closed := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	noExec := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		env    []string
		args   []string
		code   int
		stderr string
	}{
		{"no DSN", nil, []string{"run", "k", "--", "true"}, exitUsage, "no backend: pass --dsn DSN or set $DLOCK_DSN"},
		{"no command", []string{"DLOCK_DSN=mem://x"}, []string{"run", "k"}, exitUsage, "missing COMMAND"},
		{"no key", []string{"DLOCK_DSN=mem://x"}, []string{"run"}, exitUsage, "missing KEY and COMMAND"},
		{"wait and no-wait", []string{"DLOCK_DSN=mem://x"}, []string{"run", "--wait", "1s", "--no-wait", "k", "--", "true"}, exitUsage, "exclude each other"},
		{"bad ttl", []string{"DLOCK_DSN=mem://x"}, []string{"run", "--ttl", "0s", "k", "--", "true"}, exitUsage, "--ttl must be a positive duration"},
		{"unknown flag", []string{"DLOCK_DSN=mem://x"}, []string{"run", "--ttll", "1s", "k", "--", "true"}, exitUsage, "flag provided but not defined: -ttll"},
		{"argument before --", []string{"DLOCK_DSN=mem://x"}, []string{"run", "k", "extra", "--", "true"}, exitUsage, `unexpected argument "extra" between KEY and --`},
		{"unknown scheme", nil, []string{"run", "--dsn", "foo://u:sekret@h/", "k", "--", "true"}, exitUsage, `unknown DSN scheme "foo": want one of`},
		{"unknown parameter", nil, []string{"run", "--dsn", "redis://u:sekret@" + closed + "/0?tll=1s", "k", "--", "true"}, exitUsage, "unexpected option: tll"},
		{"unreachable", nil, []string{"run", "--dsn", "redis://u:sekret@" + closed + "/0", "k", "--", "true"}, exitUnavailable,
			"dlock: cannot open redis://u:xxxxx@" + closed + "/0: open (redis): "},
		{"empty key", []string{"DLOCK_DSN=mem://x"}, []string{"run", "--allow-mem", "", "--", "true"}, exitUsage, "invalid key: empty"},
		// The command is looked up before the backend is contacted.
		{"command not found", nil, []string{"run", "--dsn", "redis://" + closed, "k", "--", "no-such-command-dlock"}, exitNotFound,
			`dlock: cannot run "no-such-command-dlock": executable file not found in $PATH`},
		{"command not executable", nil, []string{"run", "--dsn", "redis://" + closed, "k", "--", noExec}, exitCannotRun, "permission denied"},
		{"unknown subcommand", nil, []string{"frob"}, exitUsage, `unknown command "frob"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, c.env, c.args...)
			r.expectCode(t, c.code)
			if !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("stderr lacks %q:\n%s", c.stderr, r.stderr)
			}
			if strings.Contains(r.stderr+r.stdout, "sekret") {
				t.Errorf("the DSN's password was printed:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for cmd, flags := range map[string][]string{
		"run":   {"--dsn", "--ttl", "--wait", "--no-wait", "--grace", "--verbose", "DLOCK_TOKEN", "DLOCK_KEY", "75", "76", "Examples", "-c SHELL-COMMAND", "--shared", "--busy-exit", "--allow-mem"},
		"lock":  {"--dsn", "--ttl", "--wait", "--no-wait", "--env", "--shared", "--busy-exit", "--allow-mem", "DLOCK_TOKEN", "SIGTERM", "75", "76", "Examples"},
		"check": {"--dsn", "--run", "--timeout", "--verbose", "Exit status", "Examples"},
		"bench": {"--dsn", "--clients", "--duration", "--out", "Exit status", "Examples"},
	} {
		for _, args := range [][]string{{"help", cmd}, {cmd, "--help"}, {cmd, "-h"}} {
			var stdout, stderr bytes.Buffer
			if code := dispatch(args, &stdout, &stderr); code != 0 {
				t.Errorf("dlock %s: exit status %d, stderr %q", strings.Join(args, " "), code, stderr.String())
			}
			for _, f := range flags {
				if !strings.Contains(stdout.String(), f) {
					t.Errorf("dlock %s does not mention %s", strings.Join(args, " "), f)
				}
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "dlock run [flags] KEY -- COMMAND") {
		t.Errorf("dlock help: status %d, output:\n%s", code, stdout.String())
	}
	if code := dispatch(nil, &stdout, &stderr); code != exitUsage {
		t.Errorf("dlock without arguments: status %d, want %d", code, exitUsage)
	}
}

func TestParseRunArgs(t *testing.T) {
	t.Setenv("DLOCK_DSN", "redis://parse:6379/0")
	cases := []struct {
		args    []string
		key     string
		command []string
		noWait  bool
		wait    time.Duration
	}{
		{[]string{"k", "--", "echo", "--no-wait"}, "k", []string{"echo", "--no-wait"}, false, 0},
		{[]string{"k", "echo", "a"}, "k", []string{"echo", "a"}, false, 0},
		{[]string{"--no-wait", "k", "--", "echo"}, "k", []string{"echo"}, true, 0},
		{[]string{"k", "--wait", "2s", "--", "echo", "--", "x"}, "k", []string{"echo", "--", "x"}, false, 2 * time.Second},
		{[]string{"--", "k", "echo"}, "k", []string{"echo"}, false, 0},
		{[]string{"k", "--no-wait", "echo", "-a"}, "k", []string{"echo", "-a"}, true, 0},
		{[]string{"-c", "echo a", "k"}, "k", []string{"/bin/sh", "-c", "echo a"}, false, 0},
		{[]string{"k", "-c", "echo a", "--wait", "2s"}, "k", []string{"/bin/sh", "-c", "echo a"}, false, 2 * time.Second},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		o, code, ok := parseRunArgs("run", c.args, &stdout, &stderr)
		if !ok {
			t.Errorf("%q: status %d: %s", c.args, code, stderr.String())
			continue
		}
		if o.key != c.key || !slices.Equal(o.command, c.command) || o.noWait != c.noWait || o.wait != c.wait || o.dsn != "redis://parse:6379/0" {
			t.Errorf("%q: key %q command %q no-wait %v wait %v dsn %q", c.args, o.key, o.command, o.noWait, o.wait, o.dsn)
		}
	}
}

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"A=1", "DLOCK_TOKEN=9", "DLOCK_KEY=old", "DLOCK_DSN=mem://x"}, "k", 42)
	want := []string{"A=1", "DLOCK_DSN=mem://x", "DLOCK_KEY=k", "DLOCK_TOKEN=42"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnv = %q, want %q", got, want)
	}
}

// backendDSNs starts the servers the run and lock tests use on more than
// one backend.
var backendDSNs = []struct {
	name string
	dsn  func(t *testing.T) string
}{
	{"redis", func(t *testing.T) string { return testenv.StartRedis(t).URL() }},
	{"postgres", func(t *testing.T) string { return testenv.StartPostgres(t).URL() }},
}

// dlock run -c runs a shell string through /bin/sh -c, as flock(1) does,
// with the token and key in its environment; -c and COMMAND exclude each
// other.
func TestRunShellString(t *testing.T) {
	t.Parallel()
	for _, b := range backendDSNs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"DLOCK_DSN=" + b.dsn(t)}
			for _, args := range [][]string{
				{"run", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN" | tr a-z A-Z; exit 3`, "jobs/sh"},
				{"run", "jobs/sh", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN" | tr a-z A-Z; exit 3`},
			} {
				r := runCLI(t, env, args...)
				r.expectCode(t, 3)
				key, tok, _ := strings.Cut(strings.TrimSpace(r.stdout), " ")
				if n, err := strconv.ParseUint(tok, 10, 64); key != "JOBS/SH" || err != nil || n == 0 {
					t.Errorf("dlock %q printed %q, want JOBS/SH and a positive token", args, r.stdout)
				}
			}
			// A busy lock with -c: the shell string does not run.
			holder := start(t, env, "run", "-c", "echo held; exec sleep 60", "jobs/sh")
			holder.expectLine("held")
			r := runCLI(t, env, "run", "--no-wait", "-c", "echo ran", "jobs/sh")
			r.expectCode(t, exitBusy)
			if r.stdout != "" {
				t.Errorf("the shell string ran while the lock was held: %q", r.stdout)
			}
		})
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-c", "true", "k", "--", "true"}, "-c and COMMAND exclude each other"},
		{[]string{"run", "-c", "true", "k", "echo"}, "-c and COMMAND exclude each other"},
		{[]string{"run", "-c", "", "k"}, "-c needs a shell command"},
		{[]string{"run", "k"}, "missing COMMAND"},
	} {
		r := runCLI(t, []string{"DLOCK_DSN=redis://127.0.0.1:1/0"}, c.args...)
		r.expectCode(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("dlock %q: stderr lacks %q:\n%s", c.args, c.want, r.stderr)
		}
	}
}

// --busy-exit N chooses the exit status for a busy lock (flock -E): with
// --no-wait and when --wait runs out, for run and lock.
func TestRunBusyExit(t *testing.T) {
	t.Parallel()
	for _, b := range backendDSNs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"DLOCK_DSN=" + b.dsn(t)}
			holder := start(t, env, "run", "busy", "--", "sh", "-c", "echo held; exec sleep 60")
			holder.expectLine("held")
			for _, c := range []struct {
				args []string
				code int
			}{
				{[]string{"run", "--no-wait", "--busy-exit", "3", "busy", "--", "echo", "ran"}, 3},
				{[]string{"run", "--wait", "200ms", "--busy-exit", "0", "busy", "--", "echo", "ran"}, 0},
				{[]string{"run", "busy", "--no-wait", "--busy-exit", "200", "-c", "echo ran"}, 200},
				{[]string{"lock", "--no-wait", "--busy-exit", "9", "busy"}, 9},
				{[]string{"lock", "--wait", "200ms", "--busy-exit", "1", "busy"}, 1},
				{[]string{"run", "--no-wait", "busy", "--", "echo", "ran"}, exitBusy},
			} {
				r := runCLI(t, env, c.args...)
				r.expectCode(t, c.code)
				if r.stdout != "" || !strings.Contains(r.stderr, `"busy" is`) {
					t.Errorf("dlock %q on a held lock: stdout %q, stderr %q", c.args, r.stdout, r.stderr)
				}
			}
		})
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--busy-exit", "3", "k", "--", "true"}, "--busy-exit applies only with --no-wait or --wait"},
		{[]string{"run", "--no-wait", "--busy-exit", "256", "k", "--", "true"}, "--busy-exit must be 0..255"},
		{[]string{"lock", "--no-wait", "--busy-exit", "-1", "k"}, "--busy-exit must be 0..255"},
	} {
		r := runCLI(t, []string{"DLOCK_DSN=redis://127.0.0.1:1/0"}, c.args...)
		r.expectCode(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("dlock %q: stderr lacks %q:\n%s", c.args, c.want, r.stderr)
		}
	}
}
