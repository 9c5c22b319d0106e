package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Defaults of ProcessConfig.
const (
	// DefaultReadyTimeout bounds the wait for a started process to become ready.
	DefaultReadyTimeout = 10 * time.Second
	// DefaultReadyInterval is the pause between two readiness probes.
	DefaultReadyInterval = 5 * time.Millisecond
	// DefaultStopGrace is how long Stop waits after SIGTERM before SIGKILL.
	DefaultStopGrace = 5 * time.Second
	// logTailLines is how many lines of the child's output error messages quote.
	logTailLines = 20
)

// ProcessConfig describes a child process for NewProcess.
type ProcessConfig struct {
	// Name names the process in messages and its log file
	// (Dir/Name.log). Default: the base name of Path.
	Name string
	// Path is the executable, usually from Binary. Required.
	Path string
	// Args are the arguments after the program name, used for every start.
	Args []string
	// Env, when non-nil, is the child's whole environment. Default: the
	// environment of the test binary.
	Env []string
	// Dir is the working directory of the child and the directory of its log
	// file. Default: a new t.TempDir().
	Dir string
	// Ports are TCP ports on 127.0.0.1 that the child will listen on. Each
	// start first checks that they are free and fails with an error wrapping
	// ErrAddrInUse when one is not, so that a leftover server cannot answer
	// the readiness probe in place of the child.
	Ports []int
	// Ready probes once whether the child, whose PID is pid, serves: it
	// returns nil when it does. It should give up when ctx is done and
	// should check, where the protocol allows, that the answer comes from pid.
	// Start calls it every ReadyInterval until it returns nil, the child
	// exits, or ReadyTimeout passes. Default: nil, ready as soon as started.
	Ready func(ctx context.Context, pid int) error
	// ReadyTimeout bounds the wait for Ready. Default: DefaultReadyTimeout (10s).
	ReadyTimeout time.Duration
	// ReadyInterval is the pause between probes. Default: DefaultReadyInterval (5ms).
	ReadyInterval time.Duration
	// StopGrace is how long Stop waits after SIGTERM before it sends
	// SIGKILL. Default: DefaultStopGrace (5s).
	StopGrace time.Duration
}

// Process is a child process the test owns. It runs in its own process group
// (whose ID is its PID) with Pdeathsig SIGKILL, so it dies if the test binary
// dies; its stdout and stderr are appended to Dir()/Name.log. Signals go to
// the process group, by ID, so helpers the child forks are paused and stopped
// with it.
//
// A Process is created by NewProcess, which registers Stop with t.Cleanup.
// Its methods are safe for concurrent use. Start and Restart report failure
// through an error and t.Fatalf respectively, so Restart must be called from
// the goroutine running the test; the other methods report unexpected
// failures with t.Errorf.
type Process struct {
	t       testing.TB
	cfg     ProcessConfig
	logPath string

	life sync.Mutex // serializes Start, Stop, Kill, Restart

	mu      sync.Mutex // guards the fields below
	cmd     *exec.Cmd
	done    chan struct{} // closed once the wait goroutine has reaped cmd
	waitErr error         // cmd.Wait's result, set before done is closed
}

// NewProcess returns a Process for cfg that is not started yet, and
// registers with t.Cleanup a call to Stop, which resumes the process if it is
// paused, stops it and waits for it. See ProcessConfig for the defaults.
func NewProcess(t testing.TB, cfg ProcessConfig) *Process {
	t.Helper()
	if cfg.Path == "" {
		t.Fatalf("testenv: ProcessConfig.Path is empty")
	}
	if cfg.Name == "" {
		cfg.Name = filepath.Base(cfg.Path)
	}
	if cfg.Dir == "" {
		// t.TempDir registers its removal before our Stop, so it runs after.
		cfg.Dir = t.TempDir()
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.ReadyInterval <= 0 {
		cfg.ReadyInterval = DefaultReadyInterval
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	cfg.Args = append([]string(nil), cfg.Args...)
	cfg.Ports = append([]int(nil), cfg.Ports...)
	p := &Process{
		t:       t,
		cfg:     cfg,
		logPath: filepath.Join(cfg.Dir, cfg.Name+".log"),
	}
	t.Cleanup(p.Stop)
	return p
}

// Start starts the process and waits until it is ready (see
// ProcessConfig.Ready). On failure the process is not running and the error
// quotes the last lines of its output; it wraps ErrAddrInUse when a port was
// taken. Starting a running process is an error.
func (p *Process) Start() error {
	p.life.Lock()
	defer p.life.Unlock()
	return p.start()
}

func (p *Process) start() error {
	if p.Alive() {
		return fmt.Errorf("testenv: %s already running as PID %d", p.cfg.Name, p.PID())
	}
	for _, port := range p.cfg.Ports {
		if !portFree(port) {
			return fmt.Errorf("testenv: %s: port 127.0.0.1:%d is taken before the start: %w", p.cfg.Name, port, ErrAddrInUse)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testenv: %s: %w", p.cfg.Name, err)
	}
	// Mark where this start begins, so that the tail quoted on failure is
	// about this start, not an earlier one.
	startOffset, _ := logf.Seek(0, io.SeekEnd)

	cmd := exec.Command(p.cfg.Path, p.cfg.Args...)
	cmd.Dir = p.cfg.Dir
	cmd.Env = p.cfg.Env
	// *os.File outputs make exec hand the descriptor to the child directly,
	// with no copying goroutine.
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("testenv: starting %s: %w", p.cfg.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.waitErr = cmd, done, nil
	p.mu.Unlock()

	// The wait goroutine is owned by the Process: it ends when the child
	// ends, and Stop and Kill (hence t.Cleanup) wait for it through done.
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()

	if err := p.waitReady(cmd.Process.Pid, done); err != nil {
		p.kill()
		tail := p.logTail(startOffset, logTailLines)
		if strings.Contains(strings.ToLower(tail), "address already in use") && !errors.Is(err, ErrAddrInUse) {
			err = fmt.Errorf("%w (%w)", err, ErrAddrInUse)
		}
		return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath, tail)
	}
	return nil
}

// waitReady polls cfg.Ready until it succeeds while the child (pid, done) is
// alive, the child exits, or the timeout passes.
func (p *Process) waitReady(pid int, done <-chan struct{}) error {
	if p.cfg.Ready == nil {
		return nil
	}
	deadline := time.Now().Add(p.cfg.ReadyTimeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	// The watcher cancels a probe in flight as soon as the child exits; it
	// ends when the child exits or when waitReady returns, which waits for it.
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-watcherDone
	}()
	exited := func() error {
		return fmt.Errorf("testenv: %s (PID %d) exited during startup: %v", p.cfg.Name, pid, p.exitErr())
	}
	ticker := time.NewTicker(p.cfg.ReadyInterval)
	defer ticker.Stop()
	var lastErr error
	for {
		probeErr := p.cfg.Ready(ctx, pid)
		// Whatever the probe saw, it proves nothing unless our child is
		// still alive: a leftover server could have answered.
		select {
		case <-done:
			return exited()
		default:
		}
		if probeErr == nil {
			return nil
		}
		// A probe cut short by the deadline says less than the one before.
		// (Compare times: ctx.Err may lag behind a deadline a dial saw.)
		if lastErr == nil || time.Now().Before(deadline) {
			lastErr = probeErr
		}
		select {
		case <-done:
			return exited()
		case <-ctx.Done():
			return fmt.Errorf("testenv: %s (PID %d) not ready after %v: %v", p.cfg.Name, pid, p.cfg.ReadyTimeout, lastErr)
		case <-ticker.C:
		}
	}
}

func (p *Process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitErr == nil {
		return errors.New("exit status 0")
	}
	return p.waitErr
}

// PID returns the process ID of the current (or last) run, or 0 before the
// first start.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Alive reports whether the process has been started and has not exited
// (a paused process is alive).
func (p *Process) Alive() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Dir returns the working directory of the process (its data directory).
func (p *Process) Dir() string { return p.cfg.Dir }

// LogPath returns the file that collects the process's stdout and stderr
// across all its runs.
func (p *Process) LogPath() string { return p.logPath }

// LogTail returns the last n lines of the process's output, for failure
// messages.
func (p *Process) LogTail(n int) string { return p.logTail(0, n) }

// LogTailExcept returns the last n lines of the process's output that
// contain none of skip (a server's routine lines, say), for failure messages.
func (p *Process) LogTailExcept(n int, skip ...string) string { return p.logTail(0, n, skip...) }

func (p *Process) logTail(offset int64, n int, skip ...string) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if offset > 0 && offset <= int64(len(b)) {
		b = b[offset:]
	}
	b = bytes.TrimRight(b, "\n")
	if len(b) == 0 {
		return "(no output)"
	}
	lines := bytes.Split(b, []byte("\n"))
	if len(skip) > 0 {
		lines = slices.DeleteFunc(lines, func(line []byte) bool {
			return slices.ContainsFunc(skip, func(s string) bool { return bytes.Contains(line, []byte(s)) })
		})
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// signal sends sig to the process group of the current run if it is alive.
// It reports whether the run was alive.
func (p *Process) signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
	}
	// The group leader is not reaped yet (done is open), so its PID, which
	// is the group ID, cannot have been reused.
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.t.Errorf("testenv: sending %v to %s (PGID %d): %v", sig, p.cfg.Name, p.cmd.Process.Pid, err)
	}
	return true
}

// wait blocks until the current run has been reaped.
func (p *Process) wait() {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Kill sends SIGKILL to the process (group) and waits until it has exited.
// It does nothing if the process is not running. A killed process can be
// started again with Restart.
func (p *Process) Kill() {
	p.life.Lock()
	defer p.life.Unlock()
	p.kill()
}

func (p *Process) kill() {
	p.signal(syscall.SIGKILL)
	p.wait()
}

// Pause stops the process with SIGSTOP: it keeps its sockets, and the kernel
// still accepts connections, but it answers nothing until Resume. Stop,
// Restart and the cleanup resume it first.
func (p *Process) Pause() {
	if !p.signal(syscall.SIGSTOP) {
		p.t.Errorf("testenv: Pause: %s is not running", p.cfg.Name)
		return
	}
	waitStopped(p.t, p.PID())
}

// waitStopped returns once every thread of process pid is in the stopped
// state. kill(2) only queues SIGSTOP: on a busy machine a multi-threaded
// server (a JVM, etcd) can still answer a request after it returns, which
// would make a test that pauses a server and then sends it a request see the
// request served. It reads /proc; where that is missing it returns at once.
func waitStopped(t testing.TB, pid int) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return // no /proc, or the process is gone
		}
		running := 0
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				continue // the thread exited
			}
			// The state follows the ")" that closes the command name.
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
				if st := stat[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
					running++
				}
			}
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("testenv: process %d: %d threads not stopped 5s after SIGSTOP", pid, running)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() {
	if !p.signal(syscall.SIGCONT) {
		p.t.Errorf("testenv: Resume: %s is not running", p.cfg.Name)
	}
}

// Stop asks the process to exit with SIGTERM (after SIGCONT, in case it is
// paused), sends SIGKILL if it has not exited after ProcessConfig.StopGrace
// (default 5s), and waits until it has exited. It is idempotent and does
// nothing if the process is not running.
func (p *Process) Stop() {
	p.life.Lock()
	defer p.life.Unlock()
	p.stop()
}

func (p *Process) stop() {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	// A stopped process ignores SIGTERM until continued; send SIGCONT first.
	if !p.signal(syscall.SIGCONT) {
		return
	}
	p.signal(syscall.SIGTERM)
	timer := time.NewTimer(p.cfg.StopGrace)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	p.kill()
}

// Restart stops the process if it is running (see Stop) and starts it again
// with the same arguments, directory and ports, waiting for readiness. It
// also starts a process that was killed or has exited. It fails the test with
// t.Fatalf, quoting the process's output, if the new run does not become
// ready, so it must be called from the goroutine running the test.
func (p *Process) Restart() {
	p.t.Helper()
	p.life.Lock()
	defer p.life.Unlock()
	p.stop()
	if err := p.start(); err != nil {
		p.t.Fatalf("testenv: restarting %s: %v", p.cfg.Name, err)
	}
}

// startRetrying runs start up to startAttempts times while it fails because a
// port was taken between FreePort and the server's bind (ErrAddrInUse); start
// picks fresh ports on each call. Any other error, or the last one, fails the
// test, named by what.
func startRetrying[T any](t testing.TB, what string, start func() (T, error)) T {
	t.Helper()
	var err error
	for range startAttempts {
		var v T
		if v, err = start(); err == nil {
			return v
		}
		if !errors.Is(err, ErrAddrInUse) {
			break
		}
	}
	t.Fatalf("testenv: %s: %v", what, err)
	var zero T
	return zero
}
