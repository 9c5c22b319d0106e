package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// newSemDriver is a driver on srv for the driver-level tests (Refresh and
// Release with forged grants), closed with the test.
func newSemDriver(t *testing.T, srv *testenv.Redis, opts *redis.Options) *redis.Driver {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	d, err := redis.NewDriver(context.Background(), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Close()
		_ = c.Close()
	})
	return d
}

func permitReq(key, owner string, n int, ttl time.Duration, wait bool) backend.AcquireRequest {
	return backend.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Permits: n, Wait: wait}
}

// score is the expiry (server ms) of slot's permit, 0 if none.
func score(t *testing.T, raw *goredis.Client, k semKeys, slot int) float64 {
	t.Helper()
	s, err := raw.ZScore(context.Background(), k.permits, strconv.Itoa(slot)).Result()
	if errors.Is(err, goredis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func slotOf(t *testing.T, key string) int {
	t.Helper()
	_, slot, ok := splitPermitKey(key)
	if !ok {
		t.Fatalf("%q is not a permit's key", key)
	}
	return slot
}

// TestPermitLayout: two permits of 3 are two entries of the sorted set
// (slot → expiry on the server's clock) and of the holders hash (slot →
// "<token> <owner> <label>"), the size key says 3, the counter holds the
// last token; every key has the semaphore's hash tag and expires with the
// last permit; once both are released only the counter is left.
func TestPermitLayout(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "")
	const name = "layout/gpu"
	k := permitKeys(redis.DefaultPrefix, name)

	before := serverMicros(t, raw) / 1000
	a, err := l.TryAcquire(ctx, name, mode.WithPermits(3), dlock.WithLabel("worker a"), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, name, mode.WithPermits(3), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	after := serverMicros(t, raw) / 1000
	if a.Key() != name+"/permits/0" || b.Key() != name+"/permits/1" {
		t.Fatalf("permits on %q and %q, want the lowest free slots 0 and 1", a.Key(), b.Key())
	}
	if b.Token() <= a.Token() || uint64(a.Token()) < before*1000 {
		t.Errorf("tokens %v then %v (server clock %d ms): not increasing, or not floored at the clock", a.Token(), b.Token(), before)
	}
	zs, err := raw.ZRangeWithScores(ctx, k.permits, 0, -1).Result()
	if err != nil || len(zs) != 2 {
		t.Fatalf("ZRANGE %s: %v, %v", k.permits, zs, err)
	}
	for i, z := range zs {
		if z.Member != strconv.Itoa(i) || z.Score < float64(before+10000) || z.Score > float64(after+10000) {
			t.Errorf("permit %d: %v, want slot %d expiring 10s after the grant (server ms %d..%d)", i, z, i, before+10000, after+10000)
		}
	}
	h, err := raw.HGetAll(ctx, k.holders).Result()
	if err != nil {
		t.Fatal(err)
	}
	ia, err := dlock.Inspect(ctx, l, a.Key())
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d %s worker a", a.Token(), ia.Owner); h["0"] != want || ia.Owner == "" {
		t.Errorf("holder of slot 0: %q, want %q", h["0"], want)
	}
	if !strings.HasPrefix(h["1"], b.Token().String()+" ") || len(h) != 2 {
		t.Errorf("holders %q: want slot 1 with token %v", h, b.Token())
	}
	if n, err := raw.Get(ctx, k.size).Result(); err != nil || n != "3" {
		t.Errorf("size key: %q, %v; want 3", n, err)
	}
	if f, err := raw.Get(ctx, k.fence).Result(); err != nil || f != b.Token().String() {
		t.Errorf("counter: %q, %v; want the last token %v", f, err, b.Token())
	}
	for _, name := range []string{k.permits, k.holders, k.size, k.fence, k.channel} {
		if !strings.Contains(name, "{layout/gpu}") || strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 {
			t.Errorf("%q does not have the semaphore's hash tag {layout/gpu} alone", name)
		}
	}
	for _, name := range []string{k.permits, k.holders, k.size} {
		if ms, err := raw.PTTL(ctx, name).Result(); err != nil || ms <= 9*time.Second || ms > 10*time.Second {
			t.Errorf("PTTL %s: %v, %v; want the last permit's 10s", name, ms, err)
		}
	}
	release(t, a)
	release(t, b)
	for _, name := range []string{k.permits, k.holders, k.size} {
		if n, _ := raw.Exists(ctx, name).Result(); n != 0 {
			t.Errorf("%s left after the last release", name)
		}
	}
	if n, _ := raw.Exists(ctx, k.fence).Result(); n != 1 {
		t.Error("the counter went with the permits: tokens would restart from the clock")
	}
}

// countHook counts the commands a client sends, by name, pipelined or not.
type countHook struct {
	mu    sync.Mutex
	count map[string]int
}

func (h *countHook) add(cmds ...goredis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		h.count[c.Name()]++
	}
}

// take returns the counts and starts again.
func (h *countHook) take() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.count
	h.count = map[string]int{}
	return m
}

func (h *countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

// TestPermitScriptCalls counts the commands the driver sends for an
// uncontended grant and a release of a permit: one script call each (the
// script loaded by a first cycle), as the server counts them too.
func TestPermitScriptCalls(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	hook := &countHook{count: map[string]int{}}
	c.AddHook(hook)
	l, err := redis.New(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	opts := []dlock.AcquireOption{mode.WithPermits(2), dlock.WithAutoRenew(false)}
	p, err := l.TryAcquire(ctx, "calls", opts...)
	if err != nil {
		t.Fatal(err)
	}
	release(t, p) // loads the script (EVALSHA, NOSCRIPT, EVAL)

	serverCalls := func() int {
		info, err := raw.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(info, "\r\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(line, cmd); ok {
					v, _, _ := strings.Cut(rest, ",")
					m, _ := strconv.Atoi(v)
					n += m
				}
			}
		}
		return n
	}
	hook.take()
	before := serverCalls()
	if p, err = l.TryAcquire(ctx, "calls", opts...); err != nil {
		t.Fatal(err)
	}
	got, server := hook.take(), serverCalls()-before
	t.Logf("an uncontended grant: the client sent %v; INFO commandstats counted %d script calls", got, server)
	if len(got) != 1 || got["evalsha"] != 1 || server != 1 {
		t.Errorf("an uncontended grant sent %v (%d script calls by INFO commandstats), want one EVALSHA", got, server)
	}
	before = serverCalls()
	release(t, p)
	got, server = hook.take(), serverCalls()-before
	t.Logf("a release: the client sent %v; INFO commandstats counted %d script calls", got, server)
	if len(got) != 1 || got["evalsha"] != 1 || server != 1 {
		t.Errorf("a release sent %v (%d script calls by INFO commandstats), want one EVALSHA", got, server)
	}
}

// TestPermitRefreshAndReleaseOwnOnly: Refresh and Release act only on the
// caller's own permit: a grant naming another owner, or the right owner
// with another token, gets ErrNotHeld and changes nothing.
func TestPermitRefreshAndReleaseOwnOnly(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	d := newSemDriver(t, srv, nil)
	k := permitKeys(redis.DefaultPrefix, "own")
	g1, err := d.Acquire(ctx, permitReq("own", "o1", 2, 2*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.Acquire(ctx, permitReq("own", "o2", 2, 2*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	s1 := slotOf(t, g1.Key)
	was := score(t, raw, k, s1)
	other := *g1
	other.Owner = g2.Owner
	stale := *g1
	stale.Token = g1.Token - 1
	for _, f := range []*backend.Grant{&other, &stale} {
		if _, err := d.Refresh(ctx, f, time.Minute); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Refresh of slot %d as %q token %d: %v, want ErrNotHeld", s1, f.Owner, f.Token, err)
		}
		if err := d.Release(ctx, f); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of slot %d as %q token %d: %v, want ErrNotHeld", s1, f.Owner, f.Token, err)
		}
	}
	if now := score(t, raw, k, s1); now != was {
		t.Fatalf("slot %d's expiry moved from %v to %v by another's refresh or release", s1, was, now)
	}
	v, err := d.Refresh(ctx, g1, time.Minute)
	if err != nil || v <= 0 {
		t.Fatalf("Refresh of the holder's own permit: %v, %v", v, err)
	}
	if now := score(t, raw, k, s1); now < was+50000 {
		t.Errorf("slot %d's expiry %v after a refresh for a minute, was %v", s1, now, was)
	}
	if ms, _ := raw.PTTL(ctx, k.holders).Result(); ms < 50*time.Second {
		t.Errorf("the semaphore's keys expire in %v, before the refreshed permit", ms)
	}
	for _, g := range []*backend.Grant{g1, g2} {
		if err := d.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, g); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("a second Release: %v, want ErrNotHeld", err)
		}
	}
}

// TestPermitRetriedAcquire: an acquire by an owner that already holds a
// permit (its first reply lost) gets the same slot again with a higher
// token, and counts once.
func TestPermitRetriedAcquire(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	d := newSemDriver(t, srv, nil)
	g1, err := d.Acquire(ctx, permitReq("retry", "o1", 2, time.Minute, false))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.Acquire(ctx, permitReq("retry", "o1", 2, time.Minute, false))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Key != g1.Key || g2.Token <= g1.Token {
		t.Fatalf("retried acquire: %q token %d after %q token %d, want the same slot and a higher token", g2.Key, g2.Token, g1.Key, g1.Token)
	}
	if n, _ := raw.ZCard(ctx, permitKeys(redis.DefaultPrefix, "retry").permits).Result(); n != 1 {
		t.Fatalf("%d permits held after a retried acquire, want 1", n)
	}
	if err := d.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}

// TestPermitOfVanishedHolder: a holder that stops renewing keeps its slot
// until its expiry (server time) and not after; the sweep frees it although
// another permit keeps the semaphore's keys alive, and a waiter polling once
// an hour is woken by the expiry (it waits until the first holder's expiry)
// and gets that slot, with a higher token.
func TestPermitOfVanishedHolder(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	d := newSemDriver(t, srv, &redis.Options{PollInterval: time.Hour})
	long, err := d.Acquire(ctx, permitReq("vanish", "long", 2, time.Minute, false))
	if err != nil {
		t.Fatal(err)
	}
	short, err := d.Acquire(ctx, permitReq("vanish", "short", 2, 500*time.Millisecond, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, permitReq("vanish", "try", 2, time.Minute, false)); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("TryAcquire of a full semaphore: %v, want ErrHeld", err)
	}
	g, err := d.Acquire(ctx, permitReq("vanish", "waiter", 2, time.Minute, true))
	got := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	deadline := short.Start.Add(short.Validity)
	switch {
	case g.Key != short.Key:
		t.Errorf("the waiter got %q, the vanished holder had %q", g.Key, short.Key)
	case got.Before(deadline):
		t.Errorf("granted %v before the vanished holder's deadline", deadline.Sub(got))
	case got.After(short.Start.Add(3 * time.Second)):
		t.Errorf("granted %v after the vanished holder's grant (TTL 500ms): the expiry did not wake the waiter", got.Sub(short.Start))
	case g.Token <= short.Token:
		t.Errorf("slot %q: token %d after %d", g.Key, g.Token, short.Token)
	}
	if _, err := d.Refresh(ctx, short, time.Minute); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh of the expired permit: %v, want ErrNotHeld", err)
	}
	for _, g := range []*backend.Grant{long, g} {
		if err := d.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPermitSizeMismatch: an acquire with another n than the holders' is
// refused with ErrSizeMismatch naming their n, at once even when it would
// wait; the size is forgotten with the last permit.
func TestPermitSizeMismatch(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	l := openLocker(t, srv, "")
	p, err := l.TryAcquire(ctx, "size", mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		_, err := l.TryAcquire(ctx, "size", mode.WithPermits(n))
		if !errors.Is(err, dlock.ErrSizeMismatch) || !strings.Contains(err.Error(), "use 2 permits") {
			t.Errorf("TryAcquire of %d while holders use 2: %v, want ErrSizeMismatch naming 2", n, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = l.Acquire(wctx, "size", mode.WithPermits(n))
		ended := wctx.Err()
		cancel()
		if !errors.Is(err, dlock.ErrSizeMismatch) || ended != nil {
			t.Errorf("Acquire of %d while holders use 2: %v, want ErrSizeMismatch at once", n, err)
		}
	}
	release(t, p)
	q, err := l.TryAcquire(ctx, "size", mode.WithPermits(3))
	if err != nil {
		t.Fatalf("a semaphore of 3 once nobody holds it with 2: %v", err)
	}
	release(t, q)
}

// TestPermitInspectListBreak: Inspect and List show a permit under its
// slot's key with its holder, label, token and expiry; SetLabel changes its
// label and keeps it renewable; Break frees it (the
// holder learns it at its next renewal) and the slot's next token is higher.
func TestPermitInspectListBreak(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	l := openLocker(t, srv, "")
	other := openLocker(t, srv, "")
	a, err := l.TryAcquire(ctx, "jobs", mode.WithPermits(2), dlock.WithLabel("worker a"), dlock.WithTTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	in, err := dlock.Inspect(ctx, other, a.Key())
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held || dlock.Token(in.Token) != a.Token() || in.Label != "worker a" || in.Owner == "" ||
		in.Expires.Before(time.Now().Add(15*time.Second)) || in.Expires.After(time.Now().Add(21*time.Second)) {
		t.Fatalf("Inspect(%q) = %+v, want held by %q with token %v, expiring in 20s", a.Key(), in, "worker a", a.Token())
	}
	if err := a.SetLabel(ctx, "worker b"); err != nil {
		t.Fatalf("SetLabel of a permit: %v", err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatalf("Refresh after SetLabel: %v", err)
	}
	if in, err := dlock.Inspect(ctx, other, a.Key()); err != nil || in.Label != "worker b" || dlock.Token(in.Token) != a.Token() {
		t.Fatalf("Inspect after SetLabel: %+v, %v; want label %q and the same token %v", in, err, "worker b", a.Token())
	}
	if in, err := dlock.Inspect(ctx, other, "jobs/permits/1"); err != nil || in.Held {
		t.Fatalf("Inspect of the free slot: %+v, %v", in, err)
	}
	for _, prefix := range []string{"", "jo", "jobs", "jobs/permits/0"} {
		ls, err := dlock.List(ctx, other, prefix)
		if err != nil || len(ls) != 1 || ls[0].Key != a.Key() || dlock.Token(ls[0].Token) != a.Token() {
			t.Errorf("List(%q) = %+v, %v; want the permit on %q", prefix, ls, err, a.Key())
		}
	}
	if ls, err := dlock.List(ctx, other, "jobs/permits/1"); err != nil || len(ls) != 0 {
		t.Errorf("List of the free slot's key: %+v, %v", ls, err)
	}
	if _, err := dlock.Break(ctx, other, "jobs/permits/1"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Break of the free slot: %v, want ErrNotHeld", err)
	}
	if _, err := dlock.Break(ctx, other, a.Key()); err != nil {
		t.Fatalf("Break(%q): %v", a.Key(), err)
	}
	if in, err := dlock.Inspect(ctx, other, a.Key()); err != nil || in.Held {
		t.Fatalf("Inspect after the break: %+v, %v", in, err)
	}
	if err := a.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("the broken holder's refresh: %v, want ErrLeaseLost", err)
	}
	b, err := other.TryAcquire(ctx, "jobs", mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if b.Key() != a.Key() || b.Token() <= a.Token() {
		t.Errorf("after the break: %q token %v, the broken permit %q token %v", b.Key(), b.Token(), a.Key(), a.Token())
	}
	release(t, b)
}

// TestPermitWaitersPushed: waiters polling once an hour are woken by the
// releases: two in one process (one subscription, so a waiter granted a
// permit wakes the next) both get the permits two releases free, and a
// waiter cancelled meanwhile leaves no subscription.
func TestPermitWaitersPushed(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	holder := openLocker(t, srv, "")
	waiters := openLocker(t, srv, "poll=1h")
	k := permitKeys(redis.DefaultPrefix, "pushed")
	var held []*dlock.Lease
	for range 2 {
		p, err := holder.TryAcquire(ctx, "pushed", mode.WithPermits(2))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error, 1)
	go func() {
		_, err := waiters.Acquire(cctx, "pushed", mode.WithPermits(2))
		cancelled <- err
	}()
	var wg sync.WaitGroup
	got := make(chan *dlock.Lease, 2)
	for range 2 {
		wg.Go(func() {
			p, err := waiters.Acquire(ctx, "pushed", mode.WithPermits(2))
			if err != nil {
				t.Errorf("waiter: %v", err)
				return
			}
			got <- p
		})
	}
	// One subscription per process; wait until it is active (NUMSUB counts
	// it once the server has it) and all three wait.
	waitFor(t, 10*time.Second, "the waiters' subscription", func() bool { return numSub(t, raw, k.channel) == 1 })
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	released := time.Now()
	release(t, held[0])
	release(t, held[1])
	for range 2 {
		select {
		case p := <-got:
			defer release(t, p)
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter polling once an hour was not granted a released permit within 5s")
		}
	}
	wg.Wait()
	t.Logf("both waiters granted %v after the releases", time.Since(released))
	waitFor(t, 10*time.Second, "the waiters' unsubscribe", func() bool { return numSub(t, raw, k.channel) == 0 })
	if n, _ := raw.ZCard(ctx, k.permits).Result(); n != 2 {
		t.Errorf("%d permits held, want the two waiters'", n)
	}
}

// TestPermitMinReplicas: with MinReplicas on a server without replicas, a
// permit is refused with ErrTooFewReplicas and given back, and a refresh
// fails the same way.
func TestPermitMinReplicas(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	k := permitKeys(redis.DefaultPrefix, "replicas")
	strict := newSemDriver(t, srv, &redis.Options{MinReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	if _, err := strict.Acquire(ctx, permitReq("replicas", "o1", 2, time.Minute, false)); !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Fatalf("acquire with MinReplicas 1 and no replica: %v, want ErrTooFewReplicas", err)
	}
	if n, _ := raw.Exists(ctx, k.permits, k.holders, k.size).Result(); n != 0 {
		t.Fatalf("the refused permit was not given back: %d keys left", n)
	}
	d := newSemDriver(t, srv, nil)
	g, err := d.Acquire(ctx, permitReq("replicas", "o2", 2, time.Minute, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Refresh(ctx, g, time.Minute); !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Errorf("refresh with MinReplicas 1 and no replica: %v, want ErrTooFewReplicas", err)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// TestPermitTokenFloor: a counter lost (an eviction, a restart without
// persistence) does not send a slot's tokens backwards: they are floored at
// the server's clock in µs.
func TestPermitTokenFloor(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "")
	p, err := l.TryAcquire(ctx, "floor", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	release(t, p)
	if err := raw.Del(ctx, permitKeys(redis.DefaultPrefix, "floor").fence).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := l.TryAcquire(ctx, "floor", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	release(t, q)
	if q.Key() != p.Key() || q.Token() <= p.Token() {
		t.Fatalf("after the counter was lost: %q token %v, before %q token %v", q.Key(), q.Token(), p.Key(), p.Token())
	}
}

// TestPermitReleasesWakeEveryLocalWaiter: two waiters in one process share
// one subscription, and each release message wakes one waiter there; when
// two permits are released back to back, the second message can reach the
// first waiter while it is being granted, so a granted waiter must wake the
// next. Over 20 rounds, with the waiters polling once an hour and the
// holders' TTLs a minute, both are granted within 5s each time.
func TestPermitReleasesWakeEveryLocalWaiter(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	holder := openLocker(t, srv, "")
	waiters := openLocker(t, srv, "poll=1h")
	k := permitKeys(redis.DefaultPrefix, "wake-all")
	opts := []dlock.AcquireOption{mode.WithPermits(2), dlock.WithTTL(time.Minute)}
	for round := range 20 {
		var held []*dlock.Lease
		for range 2 {
			p, err := holder.TryAcquire(ctx, "wake-all", opts...)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		got := make(chan *dlock.Lease, 2)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				p, err := waiters.Acquire(ctx, "wake-all", opts...)
				if err != nil {
					t.Errorf("waiter: %v", err)
					return
				}
				got <- p
			})
		}
		waitFor(t, 10*time.Second, "the waiters' subscription", func() bool { return numSub(t, raw, k.channel) == 1 })
		release(t, held[0])
		release(t, held[1])
		var granted []*dlock.Lease
		for range 2 {
			select {
			case p := <-got:
				granted = append(granted, p)
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: a waiter was not granted a released permit within 5s (it polls once an hour)", round)
			}
		}
		wg.Wait()
		for _, p := range granted {
			release(t, p)
		}
		waitFor(t, 10*time.Second, "the waiters' unsubscribe", func() bool { return numSub(t, raw, k.channel) == 0 })
	}
}

// TestPermitCluster: on a three-master Cluster, permits of semaphores whose
// keys hash to different masters are granted in one script (no CROSSSLOT:
// every key has the semaphore's hash tag), List finds them on every master,
// Break frees one, and min_replicas (no replicas here) refuses a permit and
// gives it back: the WAIT reached the semaphore's own master.
func TestPermitCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	ctx := testCtx(t)
	l := openDSN(t, cl.URL())
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	names := []string{"a", "b", "c", "d", "e", "f"}
	masters := map[string]bool{}
	var held []*dlock.Lease
	for _, name := range names {
		p, err := l.TryAcquire(ctx, name, mode.WithPermits(2), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("TryAcquire(%q) with permits on a cluster: %v", name, err)
		}
		held = append(held, p)
		m, err := cc.MasterForKey(ctx, permitKeys(redis.DefaultPrefix, name).permits)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("the semaphores all live on %v: the test proves nothing about List on every master", masters)
	}
	ls, err := dlock.List(ctx, l, "")
	if err != nil || len(ls) != len(names) {
		t.Fatalf("List on a cluster: %d permits, %v; want %d", len(ls), err, len(names))
	}
	if _, err := dlock.Break(ctx, l, held[0].Key()); err != nil {
		t.Fatalf("Break(%q) on a cluster: %v", held[0].Key(), err)
	}
	if err := held[0].Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("the broken permit's refresh: %v, want ErrLeaseLost", err)
	}
	for _, p := range held[1:] {
		release(t, p)
	}
	strict := openDSN(t, cl.URL()+"?min_replicas=1&wait_timeout=50ms")
	for _, name := range names {
		if _, err := strict.TryAcquire(ctx, name, mode.WithPermits(2)); !errors.Is(err, redis.ErrTooFewReplicas) {
			t.Fatalf("TryAcquire(%q) with permits, min_replicas=1 and no replicas: %v, want ErrTooFewReplicas", name, err)
		}
		if n, err := cc.Exists(ctx, permitKeys(redis.DefaultPrefix, name).permits).Result(); err != nil || n != 0 {
			t.Errorf("the refused permit of %q left behind: exists=%d err=%v", name, n, err)
		}
	}
}
