package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// sharedNames are the Redis names of key's shared holds (docs/redis.md,
// Shared locks).
func sharedNames(key string) (lock, readers, writers string) {
	lock = redis.LockKey(redis.DefaultPrefix, key)
	return lock, lock + ":readers", lock + ":writers"
}

// zset reads a sorted set, member → score.
func zset(t *testing.T, raw *goredis.Client, name string) map[string]float64 {
	t.Helper()
	zs, err := raw.ZRangeWithScores(context.Background(), name, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", name, err)
	}
	m := map[string]float64{}
	for _, z := range zs {
		m[z.Member.(string)] = z.Score
	}
	return m
}

func exists(t *testing.T, raw *goredis.Client, name string) bool {
	t.Helper()
	n, err := raw.Exists(context.Background(), name).Result()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", name, err)
	}
	return n == 1
}

// crashableLocker is a Locker over a client of its own; crash closes that
// client, as a killed process would leave the server.
func crashableLocker(t *testing.T, srv *testenv.Redis, opts *redis.Options) (dlock.Locker, func()) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	l, err := redis.New(context.Background(), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.Close()
		_ = c.Close()
	})
	return l, func() { _ = c.Close() }
}

// TestSharedLayout: shared holders are members of :readers (their values:
// owner ID and label) scored by their expiry on the server's clock, beside
// no lock key; their tokens and the exclusive ones strictly increase across
// modes; a waiting writer's mark in :writers keeps shared acquires out and
// goes when it is granted; an expired reader is swept by the next script;
// nothing but the counter is left.
func TestSharedLayout(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	a, b := openLocker(t, srv, ""), openLocker(t, srv, "")
	const key = "layout/rw"
	lock, readers, writers := sharedNames(key)

	before := serverMicros(t, raw) / 1000
	r1, err := a.TryAcquire(ctx, key, mode.WithShared(), dlock.WithLabel("reader one"), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.TryAcquire(ctx, key, mode.WithShared(), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("a second shared TryAcquire: %v", err)
	}
	after := serverMicros(t, raw) / 1000
	if r2.Token() <= r1.Token() || uint64(r1.Token()) < before*1000 {
		t.Errorf("shared tokens %v then %v (server clock %d ms): not increasing, or not floored at the clock", r1.Token(), r2.Token(), before)
	}
	if exists(t, raw, lock) {
		t.Errorf("the lock key %s exists while the key is held shared only", lock)
	}
	zs := zset(t, raw, readers)
	if len(zs) != 2 {
		t.Fatalf("%s = %v, want the two shared holders", readers, zs)
	}
	labelled := 0
	for m, s := range zs {
		if strings.HasSuffix(m, " reader one") {
			labelled++
		}
		if s < float64(before+10000) || s > float64(after+10000) {
			t.Errorf("shared holder %q expires at %v, want 10s after its grant (server ms %d..%d)", m, s, before+10000, after+10000)
		}
	}
	if labelled != 1 {
		t.Errorf("%s = %v: want one member whose value ends with the label \"reader one\"", readers, zs)
	}
	if pttl := raw.PTTL(ctx, readers).Val(); pttl <= 9*time.Second || pttl > 10*time.Second {
		t.Errorf("PTTL %s = %v, want the last holder's 10s", readers, pttl)
	}
	if in, err := dlock.Inspect(ctx, a, key); err != nil || !in.Held || in.Shared != 2 {
		t.Errorf("Inspect: %+v, %v; want Held and Shared 2", in, err)
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("an exclusive TryAcquire beside two shared holders: %v, want ErrNotAcquired", err)
	}

	// A waiting writer marks itself in :writers, with its own TTL; shared
	// acquires are refused from then on.
	w, err := dlock.Open(ctx, srv.URL()+"?poll=30s")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	got := waitingAcquire(ctx, w, key, dlock.WithTTL(30*time.Second))
	waitFor(t, 5*time.Second, "the waiting writer's mark", func() bool { return len(zset(t, raw, writers)) == 1 })
	markAt := serverMicros(t, raw) / 1000
	for m, s := range zset(t, raw, writers) {
		if s < float64(markAt+29000) || s > float64(markAt+30000) {
			t.Errorf("the writer's mark %q expires at %v, want its TTL (30s) after now (%d ms)", m, s, markAt)
		}
	}
	if _, err := a.TryAcquire(ctx, key, mode.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a shared TryAcquire while a writer waits: %v, want ErrNotAcquired", err)
	}
	// The last shared release wakes the writer: its poll is 30s and it
	// renews its mark every ~10s, so only the message can wake it at once.
	release(t, r1)
	select {
	case g := <-got:
		t.Fatalf("the writer was granted beside a shared holder: %+v", g)
	default:
	}
	released := time.Now()
	release(t, r2)
	var x acquired
	select {
	case x = <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiting writer was not woken by the last shared release")
	}
	if x.err != nil {
		t.Fatal(x.err)
	}
	if d := time.Since(released); d > 2*time.Second {
		t.Errorf("the writer was granted %v after the last shared release", d)
	}
	if x.lease.Token() <= r2.Token() {
		t.Errorf("exclusive token %v not above the shared one before it (%v)", x.lease.Token(), r2.Token())
	}
	if exists(t, raw, writers) || exists(t, raw, readers) {
		t.Errorf("after the writer's grant: %s exists %v, %s exists %v; want neither", writers, exists(t, raw, writers), readers, exists(t, raw, readers))
	}
	if _, err := a.TryAcquire(ctx, key, mode.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a shared TryAcquire while the key is held exclusively: %v, want ErrNotAcquired", err)
	}
	release(t, x.lease)

	// A shared grant after the exclusive one has a higher token. A shared
	// holder that vanishes stays in :readers until its expiry passes on the
	// server's clock, and the next script sweeps it then; the set itself
	// expires with its last entry.
	vl, crash := crashableLocker(t, srv, nil)
	gone, err := vl.TryAcquire(ctx, key, mode.WithShared(), dlock.WithTTL(500*time.Millisecond), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	crash() // it vanishes: no renewal, no release
	if gone.Token() <= x.lease.Token() {
		t.Errorf("shared token %v not above the exclusive one before it (%v)", gone.Token(), x.lease.Token())
	}
	stay, err := b.TryAcquire(ctx, key, mode.WithShared(), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var expiry float64
	for m, s := range zset(t, raw, readers) {
		if s < float64(serverMicros(t, raw)/1000+5000) {
			expiry = s
			_ = m
		}
	}
	if expiry == 0 {
		t.Fatalf("%s = %v: no entry for the 500ms holder", readers, zset(t, raw, readers))
	}
	waitFor(t, 3*time.Second, "the vanished reader's expiry", func() bool { return float64(serverMicros(t, raw)/1000) > expiry })
	if n := len(zset(t, raw, readers)); n != 2 {
		t.Fatalf("before any script ran, %s has %d entries; want the expired one still there", readers, n)
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("an exclusive TryAcquire beside a live shared holder: %v, want ErrNotAcquired", err)
	}
	if n := len(zset(t, raw, readers)); n != 1 {
		t.Fatalf("after a script ran, %s has %d entries; want the expired one swept", readers, n)
	}
	if in, err := dlock.Inspect(ctx, a, key); err != nil || in.Shared != 1 {
		t.Errorf("Inspect after the sweep: %+v, %v; want Shared 1", in, err)
	}
	release(t, stay)
	next, err := b.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("an exclusive TryAcquire after the shared holders left: %v", err)
	}
	if next.Token() <= stay.Token() || stay.Token() <= gone.Token() {
		t.Errorf("tokens %v (shared), %v (shared), %v (exclusive): not increasing", gone.Token(), stay.Token(), next.Token())
	}
	release(t, next)
	// A lone holder that vanishes: the set goes with its entry.
	vl2, crash2 := crashableLocker(t, srv, nil)
	lone, err := vl2.TryAcquire(ctx, key, mode.WithShared(), dlock.WithTTL(500*time.Millisecond), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	crash2()
	if pttl := raw.PTTL(ctx, readers).Val(); pttl <= 0 || pttl > 500*time.Millisecond {
		t.Errorf("PTTL %s = %v with one 500ms holder, want at most 500ms", readers, pttl)
	}
	waitFor(t, 3*time.Second, "the lone vanished reader's set to expire", func() bool { return !exists(t, raw, readers) })
	_ = lone
	if left, _ := raw.Keys(ctx, lock+"*").Result(); len(left) != 1 || left[0] != lock+":fence" {
		t.Errorf("keys left: %v, want only the counter", left)
	}
}

// TestSharedCrashedWriterMark: a waiting writer that crashes (its client
// gone, its mark never renewed nor removed) keeps shared acquires out until
// its mark's expiry on the server's clock, never after, and never before.
func TestSharedCrashedWriterMark(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "")
	const key = "crashed/writer"
	_, _, writers := sharedNames(key)

	r := mustShared(t, ctx, l, key)
	wl, crash := crashableLocker(t, srv, nil)
	got := waitingAcquire(ctx, wl, key, dlock.WithTTL(time.Second))
	waitFor(t, 5*time.Second, "the waiting writer's mark", func() bool { return len(zset(t, raw, writers)) == 1 })
	crash()
	if g := <-got; g.err == nil {
		t.Fatal("the crashed writer was granted")
	}
	var expiry float64
	for _, s := range zset(t, raw, writers) {
		expiry = s
	}
	if expiry == 0 {
		t.Fatal("the crashed writer's mark went with it; want it left to expire")
	}
	for {
		lease, err := l.TryAcquire(ctx, key, mode.WithShared())
		now := float64(serverMicros(t, raw) / 1000)
		if err == nil {
			// Granted after the refusal: the mark's expiry must have passed
			// (the server's clock is read after the grant).
			if now < expiry {
				t.Errorf("a shared grant at server ms %v, before the crashed writer's mark expired (%v)", now, expiry)
			}
			if now > expiry+2000 {
				t.Errorf("a shared grant at server ms %v, over 2s after the crashed writer's mark expired (%v)", now, expiry)
			}
			release(t, lease)
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		if now > expiry+2000 {
			t.Fatalf("shared acquires still refused 2s after the crashed writer's mark expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	release(t, r)
	if exists(t, raw, writers) {
		t.Errorf("%s still exists after the crashed writer's mark expired", writers)
	}
}

func mustShared(t *testing.T, ctx context.Context, l dlock.Locker, key string) *dlock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key, mode.WithShared())
	if err != nil {
		t.Fatalf("shared TryAcquire(%q): %v", key, err)
	}
	return lease
}

// TestSharedRefreshReleaseBreak: Refresh, Release and SetLabel of a shared
// hold act on its own entry only; Break removes every shared holder, who
// then find their leases not held.
func TestSharedRefreshReleaseBreak(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "")
	const key = "shared/break"
	_, readers, _ := sharedNames(key)

	a := mustShared(t, ctx, l, key)
	b := mustShared(t, ctx, l, key)
	if err := a.SetLabel(ctx, "relabelled"); err != nil {
		t.Fatalf("SetLabel: %v", err)
	}
	n := 0
	for m := range zset(t, raw, readers) {
		if strings.HasSuffix(m, " relabelled") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%s = %v after SetLabel: want one member with the new label", readers, zset(t, raw, readers))
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatalf("Refresh of a relabelled shared hold: %v", err)
	}
	info, err := dlock.Break(ctx, l, key)
	if err != nil {
		t.Fatalf("Break of a key held shared: %v", err)
	}
	if info.Shared != 2 {
		t.Errorf("Break's LockInfo.Shared = %d, want 2", info.Shared)
	}
	if exists(t, raw, readers) {
		t.Errorf("%s exists after Break", readers)
	}
	for _, lease := range []*dlock.Lease{a, b} {
		if err := lease.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) && !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("Refresh of a broken shared hold: %v, want lost", err)
		}
	}
	x, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("an exclusive TryAcquire after the break: %v", err)
	}
	release(t, x)
}

// TestSharedFairMode: fair mode does not claim shared locks and refuses
// them; a fair client's exclusive acquire still stays out while a client of
// the default mode holds the key shared (mixed modes exclude each other).
func TestSharedFairMode(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	fair := openLocker(t, srv, "fair=true")
	def := openLocker(t, srv, "")
	if fair.Capabilities().Shared {
		t.Error("fair mode claims Shared")
	}
	if !def.Capabilities().Shared {
		t.Error("the default mode does not claim Shared")
	}
	if _, err := fair.TryAcquire(ctx, "fair/shared", mode.WithShared()); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("shared TryAcquire in fair mode: %v, want ErrUnsupported", err)
	}
	r := mustShared(t, ctx, def, "fair/shared")
	if _, err := fair.TryAcquire(ctx, "fair/shared"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a fair exclusive TryAcquire beside a shared holder: %v, want ErrNotAcquired", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if lease, err := fair.Acquire(wctx, "fair/shared"); err == nil {
		_ = lease.Release(ctx)
		t.Fatal("a fair waiting Acquire was granted beside a shared holder")
	}
	release(t, r)
	x, err := fair.TryAcquire(ctx, "fair/shared")
	if err != nil {
		t.Fatalf("a fair exclusive TryAcquire after the shared holder left: %v", err)
	}
	release(t, x)
}

// TestSharedMinReplicas: with MinReplicas on a server without replicas, a
// shared grant is refused with ErrTooFewReplicas and given back (no entry
// left in :readers), and a refresh of a shared hold fails the same way.
func TestSharedMinReplicas(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	_, readers, _ := sharedNames("replicas")
	strict := newSemDriver(t, srv, &redis.Options{MinReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	req := backend.AcquireRequest{Key: "replicas", Owner: "o1", TTL: time.Minute, Shared: true}
	if _, err := strict.Acquire(ctx, req); !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Fatalf("shared acquire with MinReplicas 1 and no replica: %v, want ErrTooFewReplicas", err)
	}
	if exists(t, raw, readers) {
		t.Fatalf("the refused shared grant was not given back: %v", zset(t, raw, readers))
	}
	d := newSemDriver(t, srv, nil)
	req.Owner = "o2"
	g, err := d.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Refresh(ctx, g, time.Minute); !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Errorf("shared refresh with MinReplicas 1 and no replica: %v, want ErrTooFewReplicas", err)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, g); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("a second Release of a shared hold: %v, want ErrNotHeld", err)
	}
	if _, err := d.Refresh(ctx, g, time.Minute); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh of a released shared hold: %v, want ErrNotHeld", err)
	}
}

// TestReleaseWakesAWriterBehindAReader: a release wakes one waiter of each
// kind in a process. When a shared waiter subscribed before a writer of the
// same process, the writer's mark refuses the reader: the release must wake
// the writer too, or it waits out a poll interval (here 10s) for a lock that
// is free.
func TestReleaseWakesAWriterBehindAReader(t *testing.T) {
	const poll = 10 * time.Second
	_, raw, a, b, ctx := wakeSetup(t, poll)
	const key = "wake/writer-behind-reader"
	_, _, writers := sharedNames(key)
	for i := range 3 {
		lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		reader := waitingAcquire(ctx, b, key, mode.WithShared(), dlock.WithTTL(time.Minute))
		waitFor(t, 5*time.Second, "reader subscribed", func() bool {
			return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == 1
		})
		writer := waitingAcquire(ctx, b, key, dlock.WithTTL(time.Minute))
		waitFor(t, 5*time.Second, "writer marked", func() bool { return len(zset(t, raw, writers)) == 1 })
		// No signal for "the writer registered its wake-up channel", a
		// moment after its mark: give it that moment.
		time.Sleep(50 * time.Millisecond)
		release(t, grantedPromptly(t, lease, writer, poll, fmt.Sprintf("round %d: the writer", i)))
		rd := <-reader
		if rd.err != nil {
			t.Fatal(rd.err)
		}
		release(t, rd.lease)
	}
}

// TestSharedWaitersOfOneProcessGrantedTogether: a release wakes one shared
// waiter per process; granted, it passes the wake-up to the next shared
// waiter of its process, which is granted beside it at once rather than
// after a poll interval (here 10s).
func TestSharedWaitersOfOneProcessGrantedTogether(t *testing.T) {
	const poll = 10 * time.Second
	_, raw, a, b, ctx := wakeSetup(t, poll)
	const key = "wake/readers-together"
	lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	first := waitingAcquire(ctx, b, key, mode.WithShared(), dlock.WithTTL(time.Minute))
	waitFor(t, 5*time.Second, "reader subscribed", func() bool {
		return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == 1
	})
	second := waitingAcquire(ctx, b, key, mode.WithShared(), dlock.WithTTL(time.Minute))
	// No signal for "the second reader waits": give it the moment its
	// first attempt and registration take.
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	release(t, lease)
	for _, got := range []<-chan acquired{first, second} {
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		d := r.at.Sub(released)
		t.Logf("a reader was granted %v after the release", d)
		if d > poll/2 {
			t.Errorf("a reader was granted %v after the release; only a poll (%v) explains that", d, poll)
		}
		defer release(t, r.lease)
	}
}
