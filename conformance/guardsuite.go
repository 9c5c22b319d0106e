package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// GuardTarget is one resource behind a guard, as the guard suite drives it:
// a value written under a fencing token, and read back.
type GuardTarget interface {
	// Write stores value in the resource if token is at least the highest
	// token it has accepted, comparing and writing in one atomic step of the
	// resource's system. A lower token must fail with an error that matches
	// fencing.ErrStaleToken and is (errors.As) a *fencing.StaleTokenError
	// whose Token is the rejected token and Highest the highest accepted;
	// the resource is then unchanged.
	Write(ctx context.Context, token dlock.Token, value string) error

	// Read returns the resource's current value, "" if it was never
	// written. It checks no token.
	Read(ctx context.Context) (string, error)

	// Close releases the target's clients (not the resource's data).
	Close() error
}

// GuardOpener returns a target for resource, a name unique to one case of the
// suite, on the deployment that config describes (an address, a URL: the
// GuardConfig's Config, passed as is). The suite calls it in the test
// process, several times per resource, and in the child process of the
// paused-holder case, so it must build everything from its arguments.
type GuardOpener func(ctx context.Context, config, resource string) (GuardTarget, error)

var (
	guardsMu sync.Mutex
	guards   = map[string]GuardOpener{}
)

// RegisterGuard makes open the opener of the guard name, for RunGuardSuite
// and its child processes. Call it from TestMain before Main (or from an
// init function), so that a child process finds it too. It panics if open is
// nil or name is already registered.
func RegisterGuard(name string, open GuardOpener) {
	guardsMu.Lock()
	defer guardsMu.Unlock()
	if open == nil {
		panic("conformance: RegisterGuard " + name + ": nil opener")
	}
	if _, dup := guards[name]; dup {
		panic("conformance: RegisterGuard called twice for " + name)
	}
	guards[name] = open
}

func guardOpener(name string) (GuardOpener, error) {
	guardsMu.Lock()
	defer guardsMu.Unlock()
	open := guards[name]
	if open == nil {
		return nil, fmt.Errorf("conformance: no guard registered as %q (RegisterGuard in TestMain)", name)
	}
	return open, nil
}

// GuardConfig connects the guard suite to one guard on one deployment.
type GuardConfig struct {
	// Guard is the name the guard was registered under (RegisterGuard).
	// Required.
	Guard string

	// Config is passed to the guard's opener as is, in this process and in
	// child processes: an address or URL of the resource's server.
	Config string

	// LockDSN is a dlock.Open DSN, reachable from a child process, of the
	// lock service whose tokens the paused-holder case writes with (the
	// resource's own server where it is one of dlock's backends). The test
	// binary must import its driver. Required.
	LockDSN string

	// TTL is the holder's lease TTL in the paused-holder case; the holder is
	// paused for about as long. Default 2s.
	TTL time.Duration

	// Restart restarts the resource's server (best as a crash: kill, then
	// start) keeping whatever it keeps durably; the suite then checks that the
	// fence survived. Nil means the resource is not durable, and NotDurable
	// must say why.
	Restart func(t testing.TB)

	// NotDurable is why Restart is nil; the restart case is skipped with it.
	NotDurable string

	// Server names the resource's server in docs/SAFETY.md's Guards table,
	// beside the guard's name (e.g. "redis", "postgres"). Optional.
	Server string

	// Writers and OpsPerWriter size the atomicity case: Writers goroutines
	// each making OpsPerWriter writes (and a read after each) with random
	// tokens. Defaults 8 and 25.
	Writers, OpsPerWriter int

	// ValueSize pads each value the atomicity case writes to this many
	// bytes. A write that takes longer (a request body the resource reads
	// inside its guarded step) widens the window a guard that checks and
	// writes in two steps leaves open, so that the case catches it. Set it
	// where the resource takes values that large. Default 0: short values.
	ValueSize int
}

// RunGuardSuite checks that the guard cfg names accepts a token equal to or
// above the highest it has seen and rejects a lower one, naming both, in one
// atomic step that survives the resource's restart, and that a holder paused
// past its lease's TTL cannot overwrite its successor's data through it. The
// package's TestMain must call Main (for the paused holder's child process)
// after registering the guard with RegisterGuard.
func RunGuardSuite(t *testing.T, cfg GuardConfig) {
	t.Helper()
	open, err := guardOpener(cfg.Guard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Restart == nil && cfg.NotDurable == "" {
		t.Fatal("conformance: GuardConfig needs Restart, or NotDurable saying why the resource keeps nothing")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 2 * time.Second
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 8
	}
	if cfg.OpsPerWriter <= 0 {
		cfg.OpsPerWriter = 25
	}
	g := &guardSuite{cfg: cfg, open: open}
	g.runCases(t, g.cases())
}

// runCases runs cases as subtests of t, each writing its outcome to the
// safety results.
func (g *guardSuite) runCases(t *testing.T, cases []guardCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			returned := false // false in the deferred record: a panic
			defer func() { g.record(t, c.name, c.skip, !returned) }()
			if c.skip != "" {
				t.Skip(c.skip)
			}
			c.run(t)
			returned = true
		})
	}
}

// GuardCases are the names of the guard suite's cases (its subtests), in
// the order RunGuardSuite runs them.
func GuardCases() []string {
	var names []string
	for _, c := range (&guardSuite{}).cases() {
		names = append(names, c.name)
	}
	return names
}

// guardCase is one case of the guard suite: its subtest's name, its test,
// and why it is skipped ("" to run it).
type guardCase struct {
	name string
	run  func(*testing.T)
	skip string
}

func (g *guardSuite) cases() []guardCase {
	restartSkip := ""
	if g.cfg.Restart == nil {
		restartSkip = "not durable: " + g.cfg.NotDurable
	}
	return []guardCase{
		{name: "StaleRejectedEqualAccepted", run: g.testStaleRejected},
		{name: "RejectedChangesNothing", run: g.testRejectedChangesNothing},
		{name: "Atomic", run: g.testAtomic},
		{name: "SurvivesRestart", run: g.testSurvivesRestart, skip: restartSkip},
		{name: "PausedHolder", run: g.testPausedHolder},
	}
}

// record writes the outcome of t, the case name of the suite, to the safety
// results (WriteRecord): failed (also when it panicked), skipped with skip,
// or passed.
func (g *guardSuite) record(t *testing.T, name, skip string, panicked bool) {
	rec := Record{Kind: "guard", Deployment: g.cfg.Server, Guard: g.cfg.Guard, Case: name,
		Trials: 1, LatencyP50Ms: -1, LatencyMaxMs: -1, Failed: t.Failed() || (panicked && !t.Skipped())}
	if t.Skipped() && !rec.Failed {
		rec.Skip = skip
		if rec.Skip == "" {
			rec.Skip = "skipped"
		}
	}
	WriteRecord(t, rec)
}

type guardSuite struct {
	cfg  GuardConfig
	open GuardOpener
}

// resource returns a resource name unique to t's case and this run.
func guardResource(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	parts := strings.Split(t.Name(), "/")
	return "guardsuite-" + parts[len(parts)-1] + "-" + hex.EncodeToString(b[:])
}

func (g *guardSuite) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (g *guardSuite) target(t testing.TB, ctx context.Context, resource string) GuardTarget {
	t.Helper()
	tg, err := g.open(ctx, g.cfg.Config, resource)
	if err != nil {
		t.Fatalf("open guard %s for %q: %v", g.cfg.Guard, resource, err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}

func mustWrite(t testing.TB, ctx context.Context, tg GuardTarget, tok dlock.Token, v string) {
	t.Helper()
	if err := tg.Write(ctx, tok, v); err != nil {
		t.Fatalf("Write(token %d, %q) = %v, want accepted", tok, v, err)
	}
}

// mustReject checks that a write of v under tok is rejected as stale, naming
// tok and highest.
func mustReject(t testing.TB, ctx context.Context, tg GuardTarget, tok, highest dlock.Token, v string) {
	t.Helper()
	err := tg.Write(ctx, tok, v)
	if err == nil {
		t.Fatalf("Write(token %d, %q) accepted after token %d; want fencing.ErrStaleToken", tok, v, highest)
	}
	checkStale(t, err, tok, highest)
}

func checkStale(t testing.TB, err error, tok, highest dlock.Token) {
	t.Helper()
	var se *fencing.StaleTokenError
	switch {
	case !errors.Is(err, fencing.ErrStaleToken):
		t.Fatalf("write with token %d after %d: %v; want an error matching fencing.ErrStaleToken", tok, highest, err)
	case !errors.As(err, &se):
		t.Fatalf("write with token %d after %d: %v; want a *fencing.StaleTokenError", tok, highest, err)
	case se.Token != tok || se.Highest != highest:
		t.Fatalf("StaleTokenError names token %d and highest %d, want %d and %d: %v", se.Token, se.Highest, tok, highest, err)
	}
}

func mustRead(t testing.TB, ctx context.Context, tg GuardTarget, want string) {
	t.Helper()
	got, err := tg.Read(ctx)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got != want {
		t.Fatalf("Read = %q, want %q", got, want)
	}
}

// testStaleRejected: a token equal to the highest is accepted, a lower one is
// rejected with an error naming both tokens, and a higher one is accepted.
func (g *guardSuite) testStaleRejected(t *testing.T) {
	ctx := g.ctx(t)
	tg := g.target(t, ctx, guardResource(t))
	mustRead(t, ctx, tg, "")
	mustWrite(t, ctx, tg, 5, "a")
	mustRead(t, ctx, tg, "a")
	mustWrite(t, ctx, tg, 5, "b") // equal: the same holder writes again
	mustRead(t, ctx, tg, "b")
	mustReject(t, ctx, tg, 4, 5, "c")
	mustRead(t, ctx, tg, "b")
	mustWrite(t, ctx, tg, 6, "d")
	mustRead(t, ctx, tg, "d")
	mustReject(t, ctx, tg, 5, 6, "e")
}

// testRejectedChangesNothing: a stale write leaves the value and the fence as
// they were: a second target (another client) still reads the old value, the
// holder's token is still accepted, and the stale token still rejected.
func (g *guardSuite) testRejectedChangesNothing(t *testing.T) {
	ctx := g.ctx(t)
	res := guardResource(t)
	tg := g.target(t, ctx, res)
	mustWrite(t, ctx, tg, 10, "x")
	for range 3 {
		mustReject(t, ctx, tg, 9, 10, "y")
	}
	other := g.target(t, ctx, res)
	mustRead(t, ctx, other, "x")
	mustReject(t, ctx, other, 9, 10, "y") // the fence is not lowered to 9
	mustWrite(t, ctx, other, 10, "z")     // nor raised above 10
	mustRead(t, ctx, tg, "z")
}

// testSurvivesRestart: after the server restarts, the value and the fence are
// still there: the old token is rejected, the current one accepted.
func (g *guardSuite) testSurvivesRestart(t *testing.T) {
	if g.cfg.Restart == nil {
		t.Skip("not durable: " + g.cfg.NotDurable)
	}
	ctx := g.ctx(t)
	res := guardResource(t)
	tg := g.target(t, ctx, res)
	mustWrite(t, ctx, tg, 7, "before")
	g.cfg.Restart(t)
	after := g.target(t, ctx, res)
	mustRead(t, ctx, after, "before")
	mustReject(t, ctx, after, 6, 7, "stale")
	mustWrite(t, ctx, after, 7, "after")
	mustRead(t, ctx, after, "after")
}

// guardInput and guardOutput are porcupine's input and output of one request
// of the atomicity case.
type guardInput struct {
	Write bool
	Token dlock.Token
	V     string
}

type guardOutput struct {
	Stale bool   // a write rejected as stale
	V     string // the value read
}

// guardState is the fenced resource's state: the highest token accepted and
// the value.
type guardState struct {
	Fence dlock.Token
	V     string
}

// guardModel is the sequential specification of a guard: a write with a
// token at or above the fence is accepted and sets value and fence; a lower
// one is rejected and changes nothing; a read returns the value.
var guardModel = porcupine.Model{
	Init: func() any { return guardState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(guardState), input.(guardInput), output.(guardOutput)
		switch {
		case !in.Write:
			return out.V == s.V, s
		case out.Stale:
			return in.Token < s.Fence, s
		default:
			return in.Token >= s.Fence, guardState{Fence: in.Token, V: in.V}
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(guardInput), output.(guardOutput)
		if !in.Write {
			return fmt.Sprintf("read() -> %q", out.V)
		}
		verdict := "ok"
		if out.Stale {
			verdict = "stale"
		}
		return fmt.Sprintf("write(token %d, %q) -> %s", in.Token, in.V, verdict)
	},
	DescribeState: func(state any) string {
		s := state.(guardState)
		return fmt.Sprintf("fence %d, %q", s.Fence, s.V)
	},
}

// guardHistory runs the atomicity case's workload on targets (one per
// writer): ops rounds in which every writer writes once, all starting
// together (a barrier), each write followed by a read, and returns the
// history. Each value is padded with '.' to valueSize bytes; the history
// holds values without their padding.
func guardHistory(ctx context.Context, targets []GuardTarget, ops, valueSize int) ([]porcupine.Operation, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var (
		mu   sync.Mutex
		hist []porcupine.Operation
	)
	round := newBarrier(len(targets))
	errs := make(chan error, len(targets))
	var wg sync.WaitGroup
	for w, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) { errs <- err; cancel() }
			for i := range ops {
				// Tokens rise with i, with a random lead, so that writes
				// race with equal, lower and higher tokens throughout.
				tok := dlock.Token(1 + i + mrand.IntN(len(targets)))
				in := guardInput{Write: true, Token: tok, V: fmt.Sprintf("w%d-%d", w, i)}
				value := in.V
				if pad := valueSize - len(value); pad > 0 {
					value += strings.Repeat(".", pad)
				}
				if err := round.wait(ctx); err != nil {
					return // another writer failed
				}
				call := time.Since(start).Nanoseconds()
				err := tg.Write(ctx, in.Token, value)
				ret := time.Since(start).Nanoseconds()
				if err != nil && !errors.Is(err, fencing.ErrStaleToken) {
					fail(fmt.Errorf("writer %d: write with token %d: %w", w, in.Token, err))
					return
				}
				rcall := time.Since(start).Nanoseconds()
				v, rerr := tg.Read(ctx)
				rret := time.Since(start).Nanoseconds()
				if rerr != nil {
					fail(fmt.Errorf("writer %d: read: %w", w, rerr))
					return
				}
				v = strings.TrimRight(v, ".")
				mu.Lock()
				hist = append(hist,
					porcupine.Operation{ClientId: w, Input: in, Call: call, Output: guardOutput{Stale: err != nil}, Return: ret},
					porcupine.Operation{ClientId: w, Input: guardInput{}, Call: rcall, Output: guardOutput{V: v}, Return: rret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return hist, err
	}
	return hist, nil
}

// barrier lets n goroutines start each round together: wait returns once
// all n have called it for the round, or with ctx's error.
type barrier struct {
	mu      sync.Mutex
	n, here int
	gen     chan struct{} // closed when the round's last goroutine arrives
}

func newBarrier(n int) *barrier { return &barrier{n: n, gen: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	gen := b.gen
	if b.here++; b.here == b.n {
		b.here, b.gen = 0, make(chan struct{})
		close(gen)
	}
	b.mu.Unlock()
	select {
	case <-gen:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkGuardHistory checks hist with porcupine against guardModel. On a
// violation it returns an error, naming porcupine's visualisation saved as
// an artifact if visualise.
func checkGuardHistory(t testing.TB, hist []porcupine.Operation, visualise bool) error {
	res, info := porcupine.CheckOperationsVerbose(guardModel, hist, porcupineTimeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		t.Logf("porcupine: no verdict on %d operations within %v (not counted as a failure)", len(hist), porcupineTimeout)
		return nil
	}
	msg := fmt.Sprintf("guard history of %d operations is not linearizable: a check and its write were not one atomic step", len(hist))
	if !visualise {
		return errors.New(msg)
	}
	dir, err := artifactDir()
	if err != nil {
		return fmt.Errorf("%s (no visualisation: %w)", msg, err)
	}
	path := filepath.Join(dir, "porcupine-"+sanitize(t.Name())+".html")
	if err := porcupine.VisualizePath(guardModel, info, path); err != nil {
		return fmt.Errorf("%s (visualisation failed: %w)", msg, err)
	}
	return fmt.Errorf("%s; visualisation: %s", msg, path)
}

// testAtomic: Writers clients write one resource concurrently with random
// tokens, each reading after each write; porcupine checks the history against
// a guard whose check and write are one step.
func (g *guardSuite) testAtomic(t *testing.T) {
	ctx := g.ctx(t)
	res := guardResource(t)
	targets := make([]GuardTarget, g.cfg.Writers)
	for i := range targets {
		targets[i] = g.target(t, ctx, res)
	}
	hist, err := guardHistory(ctx, targets, g.cfg.OpsPerWriter, g.cfg.ValueSize)
	if err != nil {
		t.Fatal(err)
	}
	stale := 0
	for _, op := range hist {
		if op.Output.(guardOutput).Stale {
			stale++
		}
	}
	if stale == 0 {
		t.Fatalf("no write of %d was rejected: the case proves nothing", len(hist)/2)
	}
	if err := checkGuardHistory(t, hist, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes (%d rejected as stale) and %d reads linearizable", len(hist)/2, stale, len(hist)/2)
}

// testPausedHolder: a child process acquires a lease and writes through the
// guard, then is stopped (SIGSTOP) past its TTL; a contender acquires the lock
// and writes; the resumed holder writes with its old token and must be
// rejected, naming both tokens, and the data must be the contender's.
func (g *guardSuite) testPausedHolder(t *testing.T) {
	if g.cfg.LockDSN == "" {
		t.Fatal("conformance: GuardConfig.LockDSN is required")
	}
	ctx := g.ctx(t)
	res := guardResource(t)
	lockKey := "guardsuite/" + res
	spec := childSpec{Name: "holder", DSN: g.cfg.LockDSN, Keys: []string{lockKey}, TTL: g.cfg.TTL,
		Guard: g.cfg.Guard, GuardConfig: g.cfg.Config, Resource: res}
	ch := startChild(t, "guard", spec, newRegister())
	grant := g.childEvent(t, ch, "grant")
	ready := g.childEvent(t, ch, "ready") // the holder waits for our reply to write again
	tg := g.target(t, ctx, res)
	mustRead(t, ctx, tg, "holder: first")

	ch.pause(t)
	paused := time.Now()
	locker, err := dlock.Open(ctx, g.cfg.LockDSN)
	if err != nil {
		ch.resume(t)
		t.Fatalf("open %s: %v", g.cfg.Guard, err)
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, lockKey, dlock.WithTTL(30*time.Second))
	if err != nil {
		ch.resume(t)
		t.Fatalf("contender: Acquire(%q): %v", lockKey, err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	t.Logf("contender acquired %v after the holder was paused, token %d (holder's %d)", time.Since(paused).Round(time.Millisecond), lease.Token(), grant.Token)
	if lease.Token() <= grant.Token {
		ch.resume(t)
		t.Fatalf("contender's token %d is not above the paused holder's %d: the lock service does not fence", lease.Token(), grant.Token)
	}
	mustWrite(t, ctx, tg, lease.Token(), "contender")

	ch.resume(t)
	ch.mu.Lock()
	_ = ch.enc.Encode(msg{ID: ready.ID, OK: true})
	ch.mu.Unlock()
	wrote := g.childEvent(t, ch, "wrote")
	if wrote.Err == "" {
		t.Fatalf("the resumed holder's write with token %d was accepted after the contender wrote with %d", grant.Token, lease.Token())
	}
	if !wrote.OK || wrote.Token != grant.Token || wrote.Highest != lease.Token() {
		t.Fatalf("the resumed holder's write failed with %q (stale token: %v, naming tokens %d and %d), want a StaleTokenError naming %d and %d",
			wrote.Err, wrote.OK, wrote.Token, wrote.Highest, grant.Token, lease.Token())
	}
	mustRead(t, ctx, tg, "contender")
	if err := ch.stop(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}

// childEvent waits for ch's next event, which must be of type typ.
func (g *guardSuite) childEvent(t *testing.T, ch *child, typ string) msg {
	t.Helper()
	select {
	case m, ok := <-ch.events:
		if !ok {
			t.Fatalf("child exited before %q: %v", typ, ch.stop(t, time.Second))
		}
		if m.T != typ {
			t.Fatalf("child sent %q (%s), want %q", m.T, m.Err, typ)
		}
		return m
	case <-time.After(30*time.Second + 2*g.cfg.TTL):
		t.Fatalf("no %q from the child in %v: %v", typ, 30*time.Second+2*g.cfg.TTL, ch.stop(t, time.Second))
	}
	return msg{}
}

// runGuardChild is the holder of the paused-holder case: it acquires
// spec.Keys[0] with TTL spec.TTL, writes "holder: first" through the guard,
// sends "grant", and asks the parent ("ready") when to write again; given
// the go-ahead it writes "holder: late" with the same token and reports the
// outcome ("wrote"), then waits to be told to stop.
func runGuardChild(c *childConn, spec childSpec) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open, err := guardOpener(spec.Guard)
	if err != nil {
		return err
	}
	l, err := dlock.Open(ctx, spec.DSN)
	if err != nil {
		return err
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, spec.Keys[0], dlock.WithTTL(spec.TTL))
	if err != nil {
		return err
	}
	defer func() { _ = lease.Release(context.Background()) }()
	tg, err := open(ctx, spec.GuardConfig, spec.Resource)
	if err != nil {
		return err
	}
	defer tg.Close()
	if err := tg.Write(ctx, lease.Token(), "holder: first"); err != nil {
		c.send(msg{T: "error", Err: "first write: " + err.Error()})
		return err
	}
	c.send(msg{T: "grant", Key: lease.Key(), Token: lease.Token()})
	if r, ok := c.call(msg{T: "ready"}); !ok || !r.OK {
		return nil
	}
	err = tg.Write(ctx, lease.Token(), "holder: late")
	wrote := msg{T: "wrote", Token: lease.Token()}
	if err != nil {
		wrote.Err = err.Error()
		wrote.OK = errors.Is(err, fencing.ErrStaleToken)
		var se *fencing.StaleTokenError
		if errors.As(err, &se) {
			wrote.Token, wrote.Highest = se.Token, se.Highest
		}
	}
	c.send(wrote)
	<-c.stopped
	return nil
}
