package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
)

// The environment of a child process started by the suite.
const (
	envChild = "DLOCK_CONFORMANCE_CHILD" // the role: "holder", "soak" or "guard"
	envSpec  = "DLOCK_CONFORMANCE_SPEC"  // the role's childSpec, as JSON
)

// mainCalled records that the test binary's TestMain calls Main, without
// which the suite cannot start child processes.
var mainCalled bool

// Main must be called first in the TestMain of a package that runs RunFaults
// or Soak: in a child process the suite started (DLOCK_CONFORMANCE_CHILD set)
// it runs the child's part and exits, else it returns at once. Without it,
// faults and soaks that need a child are skipped.
func Main(m *testing.M) {
	mainCalled = true
	role := os.Getenv(envChild)
	if role == "" {
		return
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(envSpec)), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "conformance child: bad %s: %v\n", envSpec, err)
		os.Exit(2)
	}
	c := newChildConn(os.Stdin, os.Stdout)
	var err error
	switch role {
	case "holder":
		err = runHolderChild(c, spec)
	case "soak":
		err = runSoakChild(c, spec)
	case "guard":
		err = runGuardChild(c, spec)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance child (%s): %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childSpec tells a child what to do.
type childSpec struct {
	Name       string        // label prefix of the child's leases
	DSN        string        // opened with dlock.Open
	Keys       []string      // the keys it locks
	TTL        time.Duration // lease TTL (auto-renewed)
	Goroutines int           // soak: lockers (each its own dlock.Open)
	Interval   time.Duration // soak: least time between two acquisitions of one goroutine
	Think      time.Duration // time between a read and the write of an increment
	Role       role          // holder: what it takes of Keys[0] (a lock; roleLeader: leads an election of that name with election.Run)

	Guard       string // guard: the registered guard (RegisterGuard) it writes through
	GuardConfig string // guard: the guard's config (GuardConfig.Config)
	Resource    string // guard: the resource it writes
}

// msg is one line of the pipe protocol, both ways. From the child: "grant"
// (Lease, Key, Token, At, Deadline), "deadline" (Lease, Deadline),
// "releasing" (Lease, At), "end" (Lease, At, Lost, Err; from a soak locker
// also Deadline and Released), "op" (ID, Lease, Key, Token, Granted, Write, V);
// a guard child also "ready" (ID) and "wrote" (Token, Highest, Err, OK).
// From the parent: replies to "op" (ID, OK, V) and "ready" (ID, OK). The parent closes the child's
// stdin to tell it to stop.
type msg struct {
	T        string      `json:"t,omitempty"`
	ID       uint64      `json:"id,omitempty"`
	Lease    string      `json:"lease,omitempty"`
	Key      string      `json:"key,omitempty"`
	Lock     string      `json:"lk,omitempty"` // soak "grant": the lock key of the hold, where it is not Key (a permit's slot, a write hold's write lock)
	Token    dlock.Token `json:"tok,omitempty"`
	At       int64       `json:"at,omitempty"`
	Granted  int64       `json:"gat,omitempty"`
	Called   int64       `json:"cat,omitempty"` // "op": when the lease's Acquire was called (0: not known)
	Deadline int64       `json:"dl,omitempty"`
	Released int64       `json:"rel,omitempty"`
	Lost     bool        `json:"lost,omitempty"`
	Err      string      `json:"err,omitempty"`
	Write    bool        `json:"w,omitempty"`
	OK       bool        `json:"ok,omitempty"`
	V        int         `json:"v,omitempty"`
	Highest  dlock.Token `json:"hi,omitempty"` // guard "wrote": the highest token the rejection named
}

// childConn is the child's end of the pipe: it sends events and requests on
// stdout and dispatches the parent's replies from stdin.
type childConn struct {
	mu      sync.Mutex
	enc     *json.Encoder
	nextID  uint64
	waiting map[uint64]chan msg
	stopped chan struct{} // closed when stdin ends: the parent wants the child to stop
}

func newChildConn(in io.Reader, out io.Writer) *childConn {
	c := &childConn{enc: json.NewEncoder(out), waiting: map[uint64]chan msg{}, stopped: make(chan struct{})}
	go func() { // owned by the process; ends with stdin
		defer close(c.stopped)
		dec := json.NewDecoder(bufio.NewReader(in))
		for {
			var m msg
			if err := dec.Decode(&m); err != nil {
				return
			}
			c.mu.Lock()
			ch := c.waiting[m.ID]
			delete(c.waiting, m.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
	}()
	return c
}

func (c *childConn) send(m msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.enc.Encode(m)
}

// call sends a request and waits for its reply; ok is false if the parent
// has asked the child to stop.
func (c *childConn) call(m msg) (msg, bool) {
	ch := make(chan msg, 1)
	c.mu.Lock()
	c.nextID++
	m.ID = c.nextID
	c.waiting[m.ID] = ch
	_ = c.enc.Encode(m)
	c.mu.Unlock()
	select {
	case r := <-ch:
		return r, true
	case <-c.stopped:
		return msg{}, false
	}
}

// wallDeadline returns l's Deadline on the wall clock (ns), for the parent to
// compare with other processes' times. One reading of the clock converts it:
// time.Now().Add(time.Until(d)) would take two and put it early by the gap.
func wallDeadline(l *dlock.Lease) int64 {
	now := time.Now()
	return now.Add(l.Deadline().Sub(now)).UnixNano()
}

// increment runs one fenced increment of lease's key through the parent's
// register: read, think, write. It reports whether both were accepted.
func increment(c *childConn, key string, lease *dlock.Lease, label string, called, granted int64, think time.Duration) bool {
	base := msg{T: "op", Lease: label, Key: key, Token: lease.Token(), Called: called, Granted: granted}
	r, ok := c.call(base)
	if !ok || !r.OK {
		return false
	}
	time.Sleep(think) // think time: a pause or partition may hit between read and write
	w := base
	w.Write, w.V = true, r.V+1
	r, ok = c.call(w)
	return ok && r.OK
}

// runHolderChild is the holder of a PauseHolder trial: it acquires the one key,
// reports its grant and deadline, increments the register while its lease is
// held, and when told to stop releases it and exits. With spec.Role it takes
// a permit or a write hold instead (see take); with roleLeader (a
// LeaderPause trial) it leads an election of that name, with
// election.Run, and the end it reports is when Run cancelled the term's ctx.
func runHolderChild(c *childConn, spec childSpec) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := dlock.Open(ctx, spec.DSN)
	if err != nil {
		return err
	}
	defer l.Close()
	if spec.Role == roleLeader {
		var finish func()
		err := election.Run(ctx, election.Config{Locker: l, Name: spec.Keys[0], Value: spec.Name,
			AcquireOptions: []dlock.AcquireOption{dlock.WithTTL(spec.TTL)},
			OnStartedLeading: func(tctx context.Context, ld *election.Leadership) error {
				finish = holdAndReport(c, spec, ld.Lease(), tctx.Done(), func() error { return context.Cause(tctx) })
				return election.ErrStop // Run resigns
			}})
		if finish != nil {
			finish()
		}
		return err
	}
	lease, release, err := take(ctx, l, spec.Keys[0], spec.Role, spec.TTL)
	if err != nil {
		return err
	}
	finish := holdAndReport(c, spec, lease, lease.Done(), lease.Err)
	err = release(context.Background())
	finish()
	if err != nil && !errors.Is(err, dlock.ErrLeaseLost) && !errors.Is(err, dlock.ErrReleased) {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// holdAndReport reports lease's grant, then its deadline as it changes and
// its end (when ended is closed, with the error endErr returns), and
// increments the register while it is held, until the parent tells the child
// to stop; then it reports that the lease is being released and returns. The
// function it returns waits for the report of the end, which comes once the
// caller has released the lease.
func holdAndReport(c *childConn, spec childSpec, lease *dlock.Lease, ended <-chan struct{}, endErr func() error) (finish func()) {
	label := spec.Name
	granted := time.Now().UnixNano()
	c.send(msg{T: "grant", Lease: label, Key: lease.Key(), Token: lease.Token(), At: granted, Deadline: wallDeadline(lease)})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // reports deadline changes until the lease ends or the child stops
		defer wg.Done()
		tick := time.NewTicker(spec.TTL / 100)
		defer tick.Stop()
		last := lease.Deadline()
		for {
			select {
			case <-ended:
				if d := lease.Deadline(); !d.Equal(last) { // a renewal not reported before a pause
					c.send(msg{T: "deadline", Lease: label, Deadline: wallDeadline(lease)})
				}
				err := endErr()
				end := msg{T: "end", Lease: label, At: time.Now().UnixNano(), Err: fmt.Sprint(err)}
				end.Lost = errors.Is(err, dlock.ErrLeaseLost)
				c.send(end)
				return
			case <-done:
				return
			case <-tick.C:
				if d := lease.Deadline(); !d.Equal(last) {
					last = d
					c.send(msg{T: "deadline", Lease: label, Deadline: wallDeadline(lease)})
				}
			}
		}
	}()
	for lease.Err() == nil {
		select {
		case <-c.stopped:
		default:
			increment(c, spec.Keys[0], lease, label, 0, granted, spec.Think)
			time.Sleep(spec.Interval) // pacing between increments
			continue
		}
		break
	}
	<-c.stopped
	c.send(msg{T: "releasing", Lease: label, At: time.Now().UnixNano()})
	return func() {
		wg.Wait()
		close(done)
	}
}

// runSoakChild runs spec.Goroutines lockers, each its own dlock.Open, that
// acquire random keys of spec.Keys at most once per spec.Interval, make a few
// fenced increments and release, until the parent tells the child to stop.
func runSoakChild(c *childConn, spec childSpec) error {
	var wg sync.WaitGroup
	errs := make(chan error, spec.Goroutines)
	for g := range spec.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := soakLocker(c, spec, g); err != nil {
				errs <- fmt.Errorf("locker %d: %w", g, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// soakRoles is what the soak's handles take of each key, by the key's
// index: a lock, a permit of a semaphore of 1, a read/write lock's write
// side. The overlap check and the register see the lease that stands for
// the hold (see take); both are keyed by the name the handle asked for (the
// semaphore's, the read/write lock's), so two holds of one name at once are
// an overlap whatever locks they are on.
var soakRoles = []role{roleLock, rolePermit, roleWriter}

func soakLocker(c *childConn, spec childSpec, g int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // owned by this locker: cancels ctx when the parent says stop
		select {
		case <-c.stopped:
			cancel()
		case <-ctx.Done():
		}
	}()
	openCtx, openCancel := context.WithTimeout(ctx, time.Minute)
	l, err := dlock.Open(openCtx, spec.DSN)
	openCancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer l.Close()
	for seq := 0; ctx.Err() == nil; seq++ {
		next := time.Now().Add(spec.Interval)
		i := rand.IntN(len(spec.Keys))
		actx, acancel := context.WithTimeout(ctx, 4*spec.TTL)
		called := time.Now().UnixNano()
		lease, release, err := take(actx, l, spec.Keys[i], soakRoles[i%len(soakRoles)], spec.TTL)
		acancel()
		if err == nil {
			label := spec.Name + ".g" + strconv.Itoa(g) + "#" + strconv.Itoa(seq)
			granted := time.Now().UnixNano()
			// At is when Acquire returned; Granted when the winning request
			// was sent (Lease.Granted), for the overlap check after a lost
			// lease (see soakLease.sent).
			c.send(msg{T: "grant", Lease: label, Key: spec.Keys[i], Lock: lease.Key(), Token: lease.Token(), At: granted, Granted: lease.GrantedAt().UnixNano(), Deadline: wallDeadline(lease)})
			var doneAt atomic.Int64
			watched := make(chan struct{})
			go func() { // owned by this iteration: ends with the lease
				defer close(watched)
				<-lease.Done()
				doneAt.Store(time.Now().UnixNano())
			}()
			for n := 1 + rand.IntN(3); n > 0 && lease.Err() == nil && ctx.Err() == nil; n-- {
				increment(c, spec.Keys[i], lease, label, called, granted, spec.Think)
			}
			// The parent counts the lease as this holder's until the earliest
			// of: Done closed, Release called, and — if it was lost — its
			// Deadline, the same rule as RunFaults. Once Done is closed the
			// Deadline no longer moves, so the one read now is the last one
			// in effect, however late (a pause) this report is sent.
			relAt := time.Now().UnixNano()
			_ = release(context.Background())
			<-watched
			end := msg{T: "end", Lease: label, At: doneAt.Load(), Released: relAt, Deadline: wallDeadline(lease), Err: fmt.Sprint(lease.Err())}
			end.Lost = errors.Is(lease.Err(), dlock.ErrLeaseLost)
			c.send(end)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(next)):
		}
	}
	return nil
}

// child is the parent's handle on a child process: it serves the child's
// register requests and keeps its events.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	reg    *register
	stderr *bytes.Buffer

	mu     sync.Mutex
	enc    *json.Encoder
	events chan msg      // grant, deadline and end events, in order (buffered)
	exited chan struct{} // closed when the process has been waited for
	err    error         // the process's exit error, once exited
}

// startChild re-executes the test binary as a child in role.
func startChild(t testing.TB, role string, spec childSpec, reg *register) *child {
	t.Helper()
	if !mainCalled {
		t.Skip("the package's TestMain does not call conformance.Main, so the suite cannot start child processes")
	}
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+role, envSpec+"="+string(js))
	ownProcessGroup(cmd)
	ch := &child{name: spec.Name, cmd: cmd, reg: reg, stderr: &bytes.Buffer{},
		events: make(chan msg, 1<<16), exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: ch.stderr, mu: &ch.mu}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	ch.enc = json.NewEncoder(ch.stdin)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", spec.Name, err)
	}
	served := make(chan struct{})
	go func() { // owned by the child handle; ends when the child's stdout closes
		defer close(served)
		ch.serve(stdout)
	}()
	go func() { // owned by the child handle; ends when the process exits
		<-served
		err := cmd.Wait()
		ch.mu.Lock()
		ch.err = err
		ch.mu.Unlock()
		close(ch.exited)
	}()
	t.Cleanup(func() { ch.stop(t, 10*time.Second) })
	return ch
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func (ch *child) serve(stdout io.Reader) {
	dec := json.NewDecoder(bufio.NewReader(stdout))
	for {
		var m msg
		if err := dec.Decode(&m); err != nil {
			close(ch.events)
			return
		}
		if m.T != "op" {
			select {
			case ch.events <- m:
			default: // nobody reads events this fast; drop rather than block the child
			}
			continue
		}
		v, ok := ch.reg.op(m.Key, leaseRef{Label: m.Lease, Token: m.Token, Granted: m.Granted, Called: m.Called}, m.Write, m.V)
		ch.mu.Lock()
		_ = ch.enc.Encode(msg{ID: m.ID, OK: ok, V: v})
		ch.mu.Unlock()
	}
}

// pause stops the child with SIGSTOP and waits until it is stopped.
func (ch *child) pause(t testing.TB) {
	t.Helper()
	pid := ch.cmd.Process.Pid
	if err := stopProcess(pid); err != nil {
		t.Fatalf("SIGSTOP child %s: %v", ch.name, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !processStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %s (pid %d) not stopped 5s after SIGSTOP", ch.name, pid)
		}
		time.Sleep(time.Millisecond) // polling /proc: the kernel offers no signal for it
	}
}

// resume continues the child with SIGCONT.
func (ch *child) resume(t testing.TB) {
	t.Helper()
	if err := continueProcess(ch.cmd.Process.Pid); err != nil {
		t.Errorf("SIGCONT child %s: %v", ch.name, err)
	}
}

// processStopped reports whether every thread of pid is in state T (stopped).
func processStopped(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return false
		}
		if st := s[i+2]; st != 'T' && st != 't' {
			return false
		}
	}
	return true
}

// stop tells the child to stop (closes its stdin), resumes it in case it is
// paused, and waits up to d for it to exit, then kills it. It returns the
// child's exit error, quoting its stderr.
func (ch *child) stop(t testing.TB, d time.Duration) error {
	_ = ch.stdin.Close()
	select {
	case <-ch.exited:
	default:
		_ = continueProcess(ch.cmd.Process.Pid)
	}
	select {
	case <-ch.exited:
	case <-time.After(d):
		// SIGQUIT makes the Go runtime print every goroutine's stack and
		// exit: where the child hung is the point of the report.
		_ = quitProcess(ch.cmd.Process)
		select {
		case <-ch.exited:
		case <-time.After(5 * time.Second):
			_ = killProcessGroup(ch.cmd.Process)
			<-ch.exited
		}
		ch.mu.Lock()
		stacks := dlockStacks(ch.stderr.String())
		ch.mu.Unlock()
		return fmt.Errorf("child %s did not exit within %v of being told to stop; killed (SIGQUIT); its goroutines in dlock's code:\n%s", ch.name, d, stacks)
	}
	ch.mu.Lock()
	err := ch.err
	ch.mu.Unlock()
	if err != nil {
		return fmt.Errorf("child %s: %w; stderr:\n%s", ch.name, err, ch.stderrText())
	}
	return nil
}

// dlockStacks condenses the goroutine dump a Go program prints when it dies
// of SIGQUIT (in stderr, after whatever the child logged) to what a CI
// excerpt can hold: the child's own output before the dump (its tail), then
// each goroutine with a frame of dlock's code, as its header and its
// functions outside the runtime (its state is in the header), innermost
// first, without arguments or file lines.
func dlockStacks(stderr string) string {
	before, dump, found := strings.Cut(stderr, "SIGQUIT: quit")
	if !found {
		if len(stderr) > 4000 {
			stderr = "…" + stderr[len(stderr)-4000:]
		}
		return stderr
	}
	var b strings.Builder
	if len(before) > 1000 {
		before = "…" + before[len(before)-1000:]
	}
	b.WriteString(before)
	for _, g := range strings.Split(dump, "\n\n") {
		if !strings.Contains(g, "dlock-go/dlock") {
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "PC=") || strings.HasPrefix(line, "runtime.") {
				continue
			}
			if i := strings.LastIndexByte(line, '('); i > 0 && strings.HasSuffix(line, ")") && !strings.HasPrefix(line, "goroutine ") {
				line = line[:i] // the arguments
			}
			b.WriteString(line)
			b.WriteByte('\n')
		}
		if b.Len() > 6000 {
			b.WriteString("…\n")
			break
		}
	}
	return b.String()
}

func (ch *child) stderrText() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	s := ch.stderr.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}
