package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// dlockBin is the dlock binary the end-to-end tests run, built by TestMain.
var dlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		dlockBin = filepath.Join(dir, "dlock")
		args := []string{"build", "-tags", "dlocktest", "-o", dlockBin} // dlocktest: check_testscheme.go
		if raceEnabled {
			args = append(args, "-race")
		}
		// go test puts $GOROOT/bin first in $PATH.
		build := exec.Command("go", append(args, ".")...)
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building dlock: %v\n%s", err, out)
			return 1
		}
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// cliEnv is the environment of the dlock processes the tests start: the
// test's, without any DLOCK_ variable of the developer's, plus env.
func cliEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DLOCK_") && !strings.HasPrefix(kv, "GORACE=") {
			out = append(out, kv)
		}
	}
	// A binary built with -race sleeps a second at exit, by default, for
	// late race reports.
	out = append(out, "GORACE=atexit_sleep_ms=50 halt_on_error=1")
	return append(out, env...)
}

// result is how a dlock process ended.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// runCLI runs the dlock binary with args and env (on top of cliEnv) and
// waits for it, at most a minute.
func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, dlockBin, args...)
	cmd.Env = cliEnv(env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("dlock %s: %v\nstderr:\n%s", strings.Join(args, " "), err, r.stderr)
	}
	if ctx.Err() != nil {
		t.Fatalf("dlock %s did not finish within a minute\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
	}
	return r
}

// expectCode fails the test unless r ended with code.
func (r result) expectCode(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// background is a dlock process running while the test goes on.
type background struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string // its standard output, line by line
	stderr *syncBuffer
	done   chan struct{}
	code   int
}

// start starts dlock with args in the background. The test's cleanup kills it
// if it is still running.
func start(t *testing.T, env []string, args ...string) *background {
	t.Helper()
	cmd := exec.Command(dlockBin, args...)
	cmd.Env = cliEnv(env...)
	b := &background{t: t, cmd: cmd, lines: make(chan string, 100), stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = b.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			b.lines <- sc.Text()
		}
		close(b.lines)
		_ = cmd.Wait()
		b.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			b.code = 128 + int(ws.Signal())
		}
	}()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			_ = cmd.Process.Kill()
			<-b.done
		}
	})
	return b
}

// expectLine waits for the process to print want on a line of its own.
func (b *background) expectLine(want string) {
	b.t.Helper()
	b.expectMatch(want, func(l string) bool { return l == want })
}

// expectMatch waits for the process to print a line for which match is
// true, and returns it; what names the line in a failure.
func (b *background) expectMatch(what string, match func(string) bool) string {
	b.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-b.lines:
			if !ok {
				<-b.done
				b.t.Fatalf("dlock exited with status %d before printing %q\nstderr:\n%s", b.code, what, b.stderr)
			}
			if match(l) {
				return l
			}
		case <-timeout:
			b.t.Fatalf("dlock did not print %q within 30s\nstderr:\n%s", what, b.stderr)
		}
	}
}

// nextLine returns the next line the process prints.
func (b *background) nextLine() string {
	b.t.Helper()
	select {
	case l, ok := <-b.lines:
		if !ok {
			<-b.done
			b.t.Fatalf("dlock exited with status %d\nstderr:\n%s", b.code, b.stderr)
		}
		return l
	case <-time.After(30 * time.Second):
		b.t.Fatalf("dlock printed nothing within 30s\nstderr:\n%s", b.stderr)
	}
	return ""
}

// wait waits for the process to exit, at most d, and returns its status.
func (b *background) wait(d time.Duration) int {
	b.t.Helper()
	go func() { // drain
		for range b.lines {
		}
	}()
	select {
	case <-b.done:
		return b.code
	case <-time.After(d):
		b.t.Fatalf("dlock still running after %v\nstderr:\n%s", d, b.stderr)
	}
	return 0
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
