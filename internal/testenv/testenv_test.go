package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// errNil is returned by do for a RESP null bulk string.
var errNil = errors.New("(nil)")

// do sends one command over raw RESP to addr and returns the reply of a
// simple or bulk string; deadline bounds the whole exchange.
func do(addr string, deadline time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, deadline)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(deadline)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", errors.New(line[1:])
	case line == "$-1":
		return "", errNil
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("bad reply %q", line)
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(rd, body); err != nil {
			return "", err
		}
		return string(body[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

const answerDeadline = 2 * time.Second

func mustPing(t *testing.T, r *Redis) {
	t.Helper()
	got, err := do(r.Addr(), answerDeadline, "PING")
	if err != nil || got != "PONG" {
		t.Fatalf("PING %s = %q, %v; want PONG\n%s", r.Addr(), got, err, r.LogTail(20))
	}
}

func TestRedisLifecycle(t *testing.T) {
	r := StartRedis(t)
	addr := r.Addr()
	if want := "127.0.0.1:" + strconv.Itoa(r.Port()); addr != want {
		t.Fatalf("Addr() = %q, want %q", addr, want)
	}
	if want := "redis://" + addr + "/0"; r.URL() != want {
		t.Fatalf("URL() = %q, want %q", r.URL(), want)
	}
	if !r.Alive() || r.PID() <= 0 {
		t.Fatalf("Alive() = %v, PID() = %d after start", r.Alive(), r.PID())
	}
	mustPing(t, r)

	// Paused: the kernel still accepts the connection, but nothing answers.
	r.Pause()
	if !r.Alive() {
		t.Fatal("Alive() = false while paused")
	}
	_, err := do(addr, 200*time.Millisecond, "PING")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING while paused: err = %v, want a timeout", err)
	}
	r.Resume()
	mustPing(t, r)

	// Killed: connection refused.
	oldPID := r.PID()
	r.Kill()
	if r.Alive() {
		t.Fatal("Alive() = true after Kill")
	}
	if _, err := do(addr, answerDeadline, "PING"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("PING after Kill: err = %v, want connection refused", err)
	}
	r.Kill() // killing a dead process is a no-op

	// Restarted: same port, new process.
	r.Restart()
	if r.Addr() != addr {
		t.Fatalf("Addr() after Restart = %q, want %q", r.Addr(), addr)
	}
	if r.PID() == oldPID || !r.Alive() {
		t.Fatalf("after Restart PID = %d (was %d), Alive() = %v", r.PID(), oldPID, r.Alive())
	}
	mustPing(t, r)

	// Restart of a running (and even paused) server.
	r.Pause()
	r.Restart()
	mustPing(t, r)

	r.Stop()
	if r.Alive() {
		t.Fatal("Alive() = true after Stop")
	}
	r.Stop() // idempotent
	if _, err := do(addr, answerDeadline, "PING"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("PING after Stop: err = %v, want connection refused", err)
	}
}

func TestRedisPersistence(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []RedisOption
		want string // "" for a missing key
	}{
		{"default loses data", nil, ""},
		{"WithPersistence keeps data", []RedisOption{WithPersistence()}, "v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := StartRedis(t, tc.opts...)
			if got, err := do(r.Addr(), answerDeadline, "SET", "k", "v"); err != nil || got != "OK" {
				t.Fatalf("SET k v = %q, %v", got, err)
			}
			r.Kill()
			r.Restart()
			got, err := do(r.Addr(), answerDeadline, "GET", "k")
			switch {
			case tc.want == "" && errors.Is(err, errNil):
			case tc.want != "" && err == nil && got == tc.want:
			default:
				t.Fatalf("GET k after Kill+Restart = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// RestartEmpty loses the data even of a server with persistence, and keeps
// the port.
func TestRedisRestartEmpty(t *testing.T) {
	r := StartRedis(t, WithPersistence())
	if got, err := do(r.Addr(), answerDeadline, "SET", "k", "v"); err != nil || got != "OK" {
		t.Fatalf("SET k v = %q, %v", got, err)
	}
	if got, err := do(r.Addr(), answerDeadline, "SAVE"); err != nil || got != "OK" { // an RDB file too
		t.Fatalf("SAVE = %q, %v", got, err)
	}
	pid := r.PID()
	r.RestartEmpty()
	if r.PID() == pid {
		t.Fatal("RestartEmpty did not start a new process")
	}
	if got, err := do(r.Addr(), answerDeadline, "GET", "k"); !errors.Is(err, errNil) {
		t.Fatalf("GET k after RestartEmpty = %q, %v; want (nil)", got, err)
	}
	// Persistence is still on: what is written now survives a Restart.
	if got, err := do(r.Addr(), answerDeadline, "SET", "k", "w"); err != nil || got != "OK" {
		t.Fatalf("SET k w = %q, %v", got, err)
	}
	r.Kill()
	r.Restart()
	if got, err := do(r.Addr(), answerDeadline, "GET", "k"); err != nil || got != "w" {
		t.Fatalf("GET k after Kill+Restart = %q, %v; want w", got, err)
	}
}

func TestCleanupStopsPausedProcess(t *testing.T) {
	var pid int
	var logPath string
	begin := time.Now()
	t.Run("paused at the end", func(t *testing.T) {
		r := StartRedis(t)
		r.Pause()
		pid = r.PID()
		logPath = r.LogPath()
	})
	elapsed := time.Since(begin)
	// The process was reaped by the subtest's cleanup: its PID is gone.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill(%d, 0) after cleanup = %v, want ESRCH", pid, err)
	}
	// SIGTERM took effect (after SIGCONT) well within the grace period.
	if elapsed >= DefaultStopGrace {
		t.Fatalf("cleanup of a paused server took %v: SIGTERM was not honoured", elapsed)
	}
	// And the cleanup removed the temporary directory after the stop.
	if _, err := os.Stat(filepath.Dir(logPath)); !os.IsNotExist(err) {
		t.Fatalf("data dir still there after cleanup: %v", err)
	}
}

func TestStartFailsWhenPortTaken(t *testing.T) {
	bin := Binary(t, "redis-server", "redis-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}

	// Without Ports, the child itself fails to bind and exits; the error
	// quotes its output.
	p := NewProcess(t, ProcessConfig{Path: bin, Args: args,
		Ready: func(ctx context.Context, pid int) error {
			return redisReady(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), pid)
		}})
	err = p.Start()
	if !errors.Is(err, ErrAddrInUse) || !strings.Contains(err.Error(), "exited during startup") ||
		!strings.Contains(err.Error(), "Address already in use") {
		t.Fatalf("Start on a taken port: err = %v; want ErrAddrInUse, exit, and the log tail", err)
	}
	if p.Alive() {
		t.Fatal("Alive() after failed start")
	}

	// With Ports, the check before the start catches it.
	p = NewProcess(t, ProcessConfig{Path: bin, Args: args, Ports: []int{port}})
	if err := p.Start(); !errors.Is(err, ErrAddrInUse) || p.PID() != 0 {
		t.Fatalf("Start with taken Ports: err = %v, PID = %d; want ErrAddrInUse and no child", err, p.PID())
	}
}

func TestStartFailsWhenChildExits(t *testing.T) {
	bin := Binary(t, "redis-server", "redis-server")
	p := NewProcess(t, ProcessConfig{Path: bin, Args: []string{"--no-such-directive", "x"},
		Ready: func(ctx context.Context, pid int) error { return errors.New("never ready") }})
	err := p.Start()
	if err == nil || errors.Is(err, ErrAddrInUse) || !strings.Contains(err.Error(), "exited during startup") ||
		!strings.Contains(err.Error(), "no-such-directive") {
		t.Fatalf("Start with a bad directive: err = %v; want an exit with the log tail", err)
	}
}

func TestLeftoverServerDoesNotPassForChild(t *testing.T) {
	other := StartRedis(t) // plays a leftover server on the probed port
	sleep := Binary(t, "sleep", "coreutils")
	p := NewProcess(t, ProcessConfig{
		Path:         sleep,
		Args:         []string{"60"},
		ReadyTimeout: time.Second,
		Ready:        func(ctx context.Context, pid int) error { return redisReady(ctx, other.Addr(), pid) },
	})
	err := p.Start()
	if err == nil || !strings.Contains(err.Error(), "not by the child PID") {
		t.Fatalf("Start probed by another server: err = %v; want a PID mismatch", err)
	}
	if p.Alive() {
		t.Fatal("child still alive after a failed start")
	}
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	sh := Binary(t, "sh", "dash")
	var p *Process
	p = NewProcess(t, ProcessConfig{
		Path:      sh,
		Args:      []string{"-c", `trap "" TERM; echo started; while :; do sleep 0.05; done`},
		StopGrace: 200 * time.Millisecond,
		// Ready once the trap is set, so that SIGTERM is surely ignored.
		Ready: func(ctx context.Context, pid int) error {
			if !strings.Contains(p.LogTail(5), "started") {
				return errors.New("trap not set yet")
			}
			return nil
		},
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	p.Stop()
	if p.Alive() {
		t.Fatal("Alive() after Stop")
	}
	if d := time.Since(begin); d < 200*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Stop of a SIGTERM-ignoring process took %v, want about the 200ms grace", d)
	}
}

func TestFreePort(t *testing.T) {
	port := FreePort(t)
	if port <= 0 || !portFree(port) {
		t.Fatalf("FreePort() = %d, not bindable", port)
	}
}

// fakeTB records Fatalf and Skipf, which end the calling goroutine.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runBinary(t *testing.T, name string) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Binary(f, name, "some-debian-package")
	}()
	<-done
	return f
}

func TestBinary(t *testing.T) {
	if got := Binary(t, "redis-server", "redis-server"); filepath.Base(got) != "redis-server" {
		t.Fatalf("Binary(redis-server) = %q", got)
	}
	const missing = "dlock-testenv-no-such-binary"

	t.Setenv("CI", "")
	f := runBinary(t, missing)
	if f.fatal != "" || !strings.Contains(f.skip, "some-debian-package") ||
		!strings.Contains(f.skip, "scripts/install-test-deps.sh") {
		t.Fatalf("missing binary outside CI: skip = %q, fatal = %q; want a skip naming the package", f.skip, f.fatal)
	}

	t.Setenv("CI", "true")
	f = runBinary(t, missing)
	if f.skip != "" || !strings.Contains(f.fatal, "some-debian-package") {
		t.Fatalf("missing binary under CI=true: skip = %q, fatal = %q; want a failure", f.skip, f.fatal)
	}
}

// TestLogTailExcept: the tail leaves out the lines that contain a skipped
// string, and counts only the others.
func TestLogTailExcept(t *testing.T) {
	sh := Binary(t, "sh", "dash")
	var p *Process
	p = NewProcess(t, ProcessConfig{
		Path: sh,
		Args: []string{"-c", `echo one; echo routine two; echo three; echo routine four; echo done; sleep 60`},
		Ready: func(ctx context.Context, pid int) error {
			if !strings.Contains(p.LogTail(1), "done") {
				return errors.New("not all printed yet")
			}
			return nil
		},
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if got, want := p.LogTailExcept(2, "routine", "nothing"), "three\ndone"; got != want {
		t.Fatalf("LogTailExcept(2, routine) = %q, want %q", got, want)
	}
	if got, want := p.LogTail(2), "routine four\ndone"; got != want {
		t.Fatalf("LogTail(2) = %q, want %q", got, want)
	}
}
