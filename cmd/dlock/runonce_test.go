//go:build unix

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testenv"
)

// runsIn returns the lines of the file the test's commands append to.
func runsIn(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// appendRun is a command that appends the run's scheduled time to file.
func appendRun(file string, then string) []string {
	return []string{"sh", "-c", `echo "$DLOCK_RUN" >> "$1"; ` + then, "sh", file}
}

func TestRunOncePerTwoHosts(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	file := filepath.Join(t.TempDir(), "runs")
	// A day's period: both invocations fall in the same one unless the test
	// straddles midnight UTC, which the check on DLOCK_RUN below reports.
	args := append([]string{"run", "--once-per", "24h", "report", "--"}, appendRun(file, "sleep 0.3")...)

	a, b := start(t, env, args...), start(t, env, args...)
	codes := []int{a.wait(30 * time.Second), b.wait(30 * time.Second)}
	if runs := runsIn(t, file); len(runs) != 1 {
		t.Fatalf("two invocations of one period ran the command %d times (%v), want once; exit statuses %v\nstderr a:\n%s\nstderr b:\n%s",
			len(runs), runs, codes, a.stderr, b.stderr)
	}
	if !(codes[0] == 0 && codes[1] == exitDone || codes[0] == exitDone && codes[1] == 0) {
		t.Errorf("exit statuses %v, want 0 (ran) and %d (done elsewhere)\nstderr a:\n%s\nstderr b:\n%s", codes, exitDone, a.stderr, b.stderr)
	}
	for _, bg := range []*background{a, b} {
		if bg.code == exitDone && bg.stderr.String() != "" {
			t.Errorf("the host that did not run printed (cron mails it):\n%s", bg.stderr)
		}
	}
	want := time.Now().UTC().Truncate(24 * time.Hour).Format(time.RFC3339Nano)
	if runs := runsIn(t, file); runs[0] != want {
		t.Errorf("DLOCK_RUN = %q, want the start of the period %q", runs[0], want)
	}

	// A later invocation in the same period does not run it again.
	r := runCLI(t, env, args...)
	r.expectCode(t, exitDone)
	if runs := runsIn(t, file); len(runs) != 1 {
		t.Errorf("a later invocation ran the period's command again: %v", runs)
	}
	// -v says why.
	r = runCLI(t, env, append([]string{"run", "-v"}, args[1:]...)...)
	r.expectCode(t, exitDone)
	if !strings.Contains(r.stderr, "already made") {
		t.Errorf("-v does not say the run was made elsewhere:\n%s", r.stderr)
	}
}

func TestRunOncePerNewPeriod(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	file := filepath.Join(t.TempDir(), "runs")
	const period = 3 * time.Second
	args := append([]string{"run", "--once-per", period.String(), "tick", "--"}, appendRun(file, "true")...)

	// Start just after a boundary, so that the invocation falls in the
	// period that began there (it names its run when it starts).
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period + 50*time.Millisecond)))
	first := time.Now().Truncate(period)
	runCLI(t, env, args...).expectCode(t, 0)
	// The next period runs again, once.
	time.Sleep(time.Until(first.Add(period + 50*time.Millisecond)))
	runCLI(t, env, args...).expectCode(t, 0)
	want := []string{runAtText(first), runAtText(first.Add(period))}
	// Again in that period: not run. (On a machine too slow to start it
	// before the next boundary, it names and runs the next run instead.)
	r := runCLI(t, env, args...)
	switch inTime := time.Now().Before(first.Add(2 * period)); {
	case r.code == 0 && !inTime:
		want = append(want, runAtText(first.Add(2*period)))
	default:
		r.expectCode(t, exitDone)
	}
	if runs := runsIn(t, file); strings.Join(runs, " ") != strings.Join(want, " ") {
		t.Errorf("runs %v, want %v (each invocation started less than %v after its period's start?)", runs, want, period)
	}
}

func TestRunOncePerAtMost(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	start0 := time.Now()
	b := start(t, env, "run", "--once-per", "24h", "--at-most", "1s", "--grace", "0", "hung", "--", "sh", "-c", "echo $$; exec sleep 60")
	pid, err := strconv.Atoi(b.nextLine())
	if err != nil {
		t.Fatal(err)
	}
	if code := b.wait(20 * time.Second); code != exitLost {
		t.Fatalf("a command hung past --at-most: exit status %d, want %d\nstderr:\n%s", code, exitLost, b.stderr)
	}
	waitGone(t, pid)
	t.Logf("stderr: %s", b.stderr)
	if took := time.Since(start0); took < time.Second {
		t.Errorf("the command was stopped after %v, before --at-most 1s", took)
	}
	if s := b.stderr.String(); !strings.Contains(s, "lost") || !strings.Contains(s, "SIGKILL") {
		t.Errorf("stderr does not say the run's lease was lost and the command killed:\n%s", s)
	}
	// The run was claimed: the period is not run again.
	runCLI(t, env, "run", "--once-per", "24h", "--at-most", "1s", "hung", "--", "true").expectCode(t, exitDone)
}

func TestRunOncePerRefusedBackend(t *testing.T) {
	t.Parallel()
	dsn := testenv.StartPostgres(t).URL()
	file := filepath.Join(t.TempDir(), "runs")
	r := runCLI(t, nil, append([]string{"run", "--dsn", dsn, "--once-per", "1h", "report", "--"}, appendRun(file, "true")...)...)
	r.expectCode(t, exitUsage)
	t.Logf("stderr: %s", r.stderr)
	for _, want := range []string{"--once-per", "postgres", "redis://", "pgtable://"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if runs := runsIn(t, file); len(runs) != 0 {
		t.Errorf("the command ran on a backend that cannot keep the record: %v", runs)
	}
}

func TestRunOncePerUsage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"at-least without once-per", []string{"--at-least", "1m"}, "--at-least and --at-most need --once-per"},
		{"at-most without once-per", []string{"--at-most", "1m"}, "--at-least and --at-most need --once-per"},
		{"zero period", []string{"--once-per", "0s"}, "--once-per must be a positive duration"},
		{"bad period", []string{"--once-per", "sometimes"}, `invalid value "sometimes" for flag -once-per`},
		{"zero at-most", []string{"--once-per", "5m", "--at-most", "0s"}, "--at-most must be a positive duration"},
		{"negative at-least", []string{"--once-per", "5m", "--at-least", "-1s"}, "--at-least must be a positive duration"},
		{"at-least over at-most", []string{"--once-per", "5m", "--at-least", "2m", "--at-most", "1m"}, "--at-least (2m0s) exceeds --at-most (1m0s)"},
		{"at-least over the period", []string{"--once-per", "5m", "--at-least", "10m"}, "--at-least (10m0s) exceeds --at-most (default: the period, 5m0s)"},
		{"with shared", []string{"--once-per", "5m", "--shared"}, "--once-per excludes --shared"},
		{"with permits", []string{"--once-per", "5m", "--permits", "2"}, "--once-per excludes --permits"},
		{"with no-wait", []string{"--once-per", "5m", "--no-wait"}, "--once-per excludes --no-wait"},
		{"with ttl", []string{"--once-per", "5m", "--ttl", "1m"}, "--once-per excludes --ttl"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"run", "--dsn", "mem://x", "--allow-mem"}, c.args...), "k", "--", "true")
			if code := dispatch(args, &stdout, &stderr); code != exitUsage {
				t.Fatalf("dlock %s: exit status %d, want %d\nstderr:\n%s", strings.Join(args, " "), code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("stderr lacks %q:\n%s", c.stderr, stderr.String())
			}
		})
	}

	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"help", "run"}, &stdout, &stderr); code != 0 {
		t.Fatalf("dlock help run: %d", code)
	}
	for _, want := range []string{"--once-per PERIOD", "--at-least D", "--at-most D", "*/5 * * * *", "79", "DLOCK_RUN"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("dlock help run lacks %q", want)
		}
	}
}

func TestRunOncePerBusy(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}
	// Another run holds the job (its lease key) for longer than --wait.
	holder := start(t, env, "run", "schedule/job/busy", "--", "sh", "-c", "echo held; exec sleep 60")
	holder.expectLine("held")
	r := runCLI(t, env, "run", "--once-per", "24h", "--wait", "300ms", "busy", "--", "echo", "ran")
	r.expectCode(t, exitBusy)
	if r.stdout != "" || !strings.Contains(r.stderr, `the job "busy" is still held by another run`) {
		t.Errorf("stdout %q, stderr:\n%s", r.stdout, r.stderr)
	}
	runCLI(t, env, "run", "--once-per", "24h", "--wait", "300ms", "--busy-exit", "3", "busy", "--", "echo", "ran").expectCode(t, 3)
}
