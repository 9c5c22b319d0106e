package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
	"github.com/dlock-go/dlock/internal/testenv"
	dlockredis "github.com/dlock-go/dlock/redis"
)

// BenchmarkRedisHandoffSteps takes the fair mode's hand-off apart, step by
// step from the raw direct hand-off, all interleaved round by round on one
// server (docs/BENCHMARKS.md measures the fair mode's hand-off target with
// it). Each implementation has two clients: in every round one holds the
// lock, the other calls lock and waits; once the waiter is in the server's
// queue the holder keeps the lock rotateHold more, making no request, and
// releases; the hand-off is the time from the start of that release to the
// waiter's lock call returning. The steps:
//
//   - handoff-floor: the least a direct hand-off takes (see redisHandoffFloor):
//     one script, one message, no token;
//   - scripts: dlock's own fair-mode scripts (fair_acquire.lua,
//     fair_release.lua) on a raw client, waiting for the hand-off message on
//     a channel of its own: the token, the waiters' TTLs and records, but no
//     driver;
//   - driver: the redis driver with fair=true, called as the Locker calls it
//     (its pub/sub multiplexer, its hand-off check), but no Locker;
//   - dlock-fair: dlock.Open with ?fair=true: the Locker and its lease.
//
// Each round also measures round trips made from the same idle state (no
// request for rotateHold): a PING, and a script call (the floor's release
// script on a key nobody holds: a GET, an LREM and a reply). A hand-off
// starts from that state — the holder made no request while it held the
// lock — so these are the round trips to compare it with, rather than those
// of a busy loop.
//
// Reported, over the rounds: IMPL.handoff-p50-ns, IMPL.handoff-p99-ns,
// ping.rtt-p50-ns and script.rtt-p50-ns.
func BenchmarkRedisHandoffSteps(b *testing.B) {
	srv := testenv.StartRedis(b)
	impls := handoffStepImpls(srv)
	b.Run("Handoff", func(b *testing.B) {
		r := runHandoffSteps(b, impls, srv.Addr(), b.N)
		for _, s := range r.steps {
			report(b, float64(pct(s.handoffs, 50).Nanoseconds()), s.name+".handoff-p50-ns")
			report(b, float64(pct(s.handoffs, 99).Nanoseconds()), s.name+".handoff-p99-ns")
		}
		report(b, float64(pct(r.ping, 50).Nanoseconds()), "ping.rtt-p50-ns")
		report(b, float64(pct(r.script, 50).Nanoseconds()), "script.rtt-p50-ns")
	})
}

// handoffImpl is a step of BenchmarkRedisHandoffSteps: an implementation,
// and the server key of its waiters' queue for a lock key (it exists while
// anyone waits).
type handoffImpl struct {
	impl
	queue func(key string) string
}

// handoffStepImpls are BenchmarkRedisHandoffSteps' steps on srv.
func handoffStepImpls(srv *testenv.Redis) []handoffImpl {
	driverQueue := func(key string) string { return rediscore.KeysFor(dlockredis.DefaultPrefix, key).Queue() }
	return []handoffImpl{
		{impl{name: "handoff-floor", newLocker: func(tb testing.TB) locker { return newRedisHandoffFloor(tb, srv.Addr()) }},
			handoffFloorQueue},
		{impl{name: "scripts", newLocker: func(tb testing.TB) locker { return newRedisFairScripts(tb, srv.Addr()) }},
			func(key string) string { return rediscore.KeysFor(fairScriptsPrefix, key).Queue() }},
		{impl{name: "driver", newLocker: func(tb testing.TB) locker { return openDriver(tb, srv.URL()+"?fair=true") }}, driverQueue},
		{dlockImpl("dlock-fair", srv.URL()+"?fair=true", nil), driverQueue},
	}
}

type handoffStep struct {
	name     string
	handoffs []time.Duration
}

type handoffStepsResult struct {
	steps        []handoffStep
	ping, script []time.Duration // round trips from idle
}

// runHandoffSteps makes rounds hand-offs with every implementation of impls,
// in an order shuffled every round, and measures the round trips from idle
// on a client of addr. A waiter granted before its holder's release began
// fails the run.
func runHandoffSteps(tb testing.TB, impls []handoffImpl, addr string, rounds int) handoffStepsResult {
	ctx := context.Background()
	c := newRedisClient(tb, addr)
	// One per implementation: its holder and waiter, its key, and whether
	// anyone waits for the key on the server.
	type pair struct {
		holder, waiter locker
		key            string
		queued         func() (bool, error)
	}
	pairs := make([]pair, len(impls))
	res := handoffStepsResult{steps: make([]handoffStep, len(impls))}
	for i, im := range impls {
		key := uniqueKey("handoff-steps", im.name)
		queue := im.queue(key)
		pairs[i] = pair{im.newLocker(tb), im.newLocker(tb), key, func() (bool, error) {
			n, err := c.Exists(ctx, queue).Result()
			return n > 0, err
		}}
		res.steps[i] = handoffStep{name: im.name, handoffs: make([]time.Duration, 0, rounds)}
		// One warm-up hand-off: connections, scripts, subscriptions.
		if _, err := handOff(ctx, pairs[i].holder, pairs[i].waiter, key, pairs[i].queued); err != nil {
			tb.Fatalf("%s: warm-up: %v", im.name, err)
		}
	}
	if err := handoffFloorRelease.Load(ctx, c).Err(); err != nil {
		tb.Fatalf("SCRIPT LOAD: %v", err)
	}
	free := []string{uniqueKey("handoff-steps", "rtt"), uniqueKey("handoff-steps", "rtt-queue")}
	probes := []struct {
		into *[]time.Duration
		call func() error
	}{
		{&res.ping, func() error { return c.Ping(ctx).Err() }},
		{&res.script, func() error {
			return handoffFloorRelease.EvalSha(ctx, c, free, "nobody", benchTTL.Milliseconds(), handoffFloorChannel).Err()
		}},
	}
	resetTimer(tb)
	inShuffledRounds(len(impls)+len(probes), rounds, func(i int) {
		if i >= len(impls) {
			p := probes[i-len(impls)]
			time.Sleep(rotateHold)
			start := time.Now()
			if err := p.call(); err != nil {
				tb.Fatalf("round trip: %v", err)
			}
			*p.into = append(*p.into, time.Since(start))
			return
		}
		p := pairs[i]
		d, err := handOff(ctx, p.holder, p.waiter, p.key, p.queued)
		if err != nil {
			tb.Fatalf("%s: %v", impls[i].name, err)
		}
		res.steps[i].handoffs = append(res.steps[i].handoffs, d)
	})
	stopTimer(tb)
	return res
}

// handOff makes one hand-off of key from holder to waiter: holder takes it,
// waiter calls lock and waits, and once queued reports the waiter in the
// server's queue, holder keeps the lock rotateHold more, making no request,
// and releases. It returns the time from the start of the release to
// waiter's lock call returning, and leaves key free.
func handOff(ctx context.Context, holder, waiter locker, key string, queued func() (bool, error)) (time.Duration, error) {
	release, err := holder.lock(ctx, key, false)
	if err != nil {
		return 0, fmt.Errorf("holder: lock: %w", err)
	}
	type grant struct {
		unlock func() error
		at     time.Time
		err    error
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got := make(chan grant, 1)
	go func() {
		unlock, err := waiter.lock(ctx, key, true)
		got <- grant{unlock, time.Now(), err}
	}()
	// fail ends a hand-off that went wrong before the release: it stops the
	// waiter, releases, and gives back what the waiter may have got.
	fail := func(err error) (time.Duration, error) {
		cancel()
		err = errors.Join(err, release())
		if g := <-got; g.err == nil {
			err = errors.Join(err, g.unlock())
		}
		return 0, err
	}
	// The waiter's lock call gives no sign that it has queued: ask the
	// server, then leave both idle for the hold.
	for {
		select {
		case g := <-got:
			got <- g // for fail
			return fail(errors.New("the waiter's lock call returned before the holder's release began"))
		default:
		}
		in, err := queued()
		switch {
		case err != nil:
			return fail(fmt.Errorf("is the waiter queued: %w", err))
		case ctx.Err() != nil:
			return fail(fmt.Errorf("the waiter did not queue: %w", ctx.Err()))
		}
		if in {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(rotateHold)
	start := time.Now()
	errRelease := release()
	g := <-got
	switch {
	case errRelease != nil && g.err == nil:
		errRelease = errors.Join(errRelease, g.unlock())
		return 0, fmt.Errorf("holder: unlock: %w", errRelease)
	case errRelease != nil:
		return 0, fmt.Errorf("holder: unlock: %w (waiter: %w)", errRelease, g.err)
	case g.err != nil:
		return 0, fmt.Errorf("waiter: lock: %w", g.err)
	}
	if err := g.unlock(); err != nil {
		return 0, fmt.Errorf("waiter: unlock: %w", err)
	}
	if !g.at.After(start) {
		return 0, fmt.Errorf("the waiter was granted %v before the holder's release began", start.Sub(g.at))
	}
	return g.at.Sub(start), nil
}

// redisFairScripts runs dlock's fair-mode scripts (fair_acquire.lua,
// fair_release.lua) on a raw client, with the driver's keys and arguments: a
// refused waiter joins the queue and waits for the hand-off message on a
// channel of its own, and needs no request of its own to hold the lock. No
// waiter's renewal of its place, no lease: a step of
// BenchmarkRedisHandoffSteps, not a lock to use.
type redisFairScripts struct {
	c    *goredis.Client
	id   string // the owner id, and the wake-up channel's (rediscore.WaiterChannel)
	msgs <-chan *goredis.Message
}

// fairScriptsPrefix prefixes redisFairScripts' keys and channels.
const fairScriptsPrefix = "scripts:"

func newRedisFairScripts(tb testing.TB, addr string) *redisFairScripts {
	id := backend.NewOwnerID()
	c, msgs := newRawWaiterClient(tb, addr, "scripts", rediscore.WaiterChannel(fairScriptsPrefix, id), rediscore.FairAcquire, rediscore.FairRelease)
	return &redisFairScripts{c: c, id: id, msgs: msgs}
}

func (f *redisFairScripts) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	k := rediscore.KeysFor(fairScriptsPrefix, key)
	ms := benchTTL.Milliseconds()
	join := "0"
	if wait {
		join = "1"
	}
	unlock := func() error {
		n, err := rediscore.FairRelease.EvalSha(context.Background(), f.c, k.FairReleaseKeys(), f.id, k.Channel, "0", "1").Int()
		if err == nil && n != 1 {
			err = fmt.Errorf("scripts: %q was not ours at release", key)
		}
		return err
	}
	res, err := rediscore.FairAcquire.EvalSha(ctx, f.c, k.FairAcquireKeys(), f.id, ms, join, ms, k.Channel, rediscore.WaiterChannel(fairScriptsPrefix, f.id)).Int64Slice()
	switch {
	case err != nil:
		return nil, err
	case len(res) > 0 && res[0] == 1:
		return unlock, nil
	case !wait:
		return nil, fmt.Errorf("scripts: %q is held", key)
	}
	for {
		select {
		case m := <-f.msgs:
			if _, to, ok := rediscore.ParseHandoff(m.Payload); ok && to == f.id {
				return unlock, nil
			}
		case <-ctx.Done():
			// Leaves the queue, or passes on a lock handed over meanwhile.
			_ = rediscore.FairRelease.EvalSha(context.Background(), f.c, k.FairReleaseKeys(), f.id, k.Channel, "1", "1").Err()
			return nil, ctx.Err()
		}
	}
}

// TestSmokeHandoffSteps runs BenchmarkRedisHandoffSteps's steps a few rounds,
// as TestSmoke does the other scenarios.
func TestSmokeHandoffSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server: not in -short")
	}
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs after the servers' and clients' cleanups
	srv := testenv.StartRedis(t)
	impls := handoffStepImpls(srv)
	const rounds = 3
	r := runHandoffSteps(t, impls, srv.Addr(), rounds)
	if len(r.steps) != len(impls) {
		t.Fatalf("%d steps measured, want %d", len(r.steps), len(impls))
	}
	for _, s := range r.steps {
		if len(s.handoffs) != rounds || pct(s.handoffs, 50) <= 0 {
			t.Errorf("%s: hand-offs %v, want %d, all > 0", s.name, s.handoffs, rounds)
		}
	}
	if len(r.ping) != rounds || len(r.script) != rounds || pct(r.ping, 50) <= 0 || pct(r.script, 50) <= 0 {
		t.Errorf("round trips: PING %v, script %v, want %d of each, all > 0", r.ping, r.script, rounds)
	}
}

// TestHandOffCatchesAnEarlyGrant checks that handOff fails a waiter granted
// before its holder's release: with a lock that never excludes, the waiter
// returns at once, before it is queued.
func TestHandOffCatchesAnEarlyGrant(t *testing.T) {
	_, err := handOff(context.Background(), nonExclusive{}, nonExclusive{}, "k", func() (bool, error) { return false, nil })
	if err == nil || !strings.Contains(err.Error(), "before the holder's release began") {
		t.Fatalf("handOff with a lock that does not exclude: %v, want the early grant reported", err)
	}
}

// nonExclusive grants every lock call at once: a broken lock, for
// TestHandOffCatchesAnEarlyGrant.
type nonExclusive struct{}

func (nonExclusive) lock(context.Context, string, bool) (func() error, error) {
	return func() error { return nil }, nil
}

// TestHandoffReleaseCommands counts the commands a release script runs when
// it hands the lock to a waiting client (INFO commandstats, the script call
// itself not counted): the raw direct hand-off's 4 and dlock's fair mode's
// 15, the figures docs/redis.md and the report give for what dlock's
// hand-off adds. A change to either script that changes them must change
// those texts too.
func TestHandoffReleaseCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server: not in -short")
	}
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	c := newRedisClient(t, srv.Addr())
	// commands runs release after a reset of the server's statistics and
	// returns how many commands it ran.
	commands := func(release func() (int, error)) int {
		t.Helper()
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := release(); err != nil || n != 1 {
			t.Fatalf("release: %d, %v; want 1 (released and handed over)", n, err)
		}
		stats, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for line := range strings.Lines(stats) {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
			if !ok || name == "eval" || name == "evalsha" || strings.HasPrefix(name, "config") {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.Atoi(calls)
			if err != nil {
				t.Fatalf("INFO commandstats: %q: %v", line, err)
			}
			total += n
		}
		return total
	}
	ms := benchTTL.Milliseconds()

	floor := []string{"floor-key", handoffFloorQueue("floor-key")}
	for i, owner := range []string{"A", "B"} {
		if n, err := handoffFloorAcquire.Run(ctx, c, floor, owner, ms, "1").Int(); err != nil || n != 1-i {
			t.Fatalf("floor: %s's acquire: %d, %v; want %d", owner, n, err, 1-i)
		}
	}
	if got := commands(func() (int, error) {
		return handoffFloorRelease.Run(ctx, c, floor, "A", ms, handoffFloorChannel).Int()
	}); got != 4 {
		t.Errorf("the raw direct hand-off's release ran %d commands, want 4", got)
	}

	k := rediscore.KeysFor(fairScriptsPrefix, "fair-key")
	for i, owner := range []string{"A", "B"} {
		res, err := rediscore.FairAcquire.Run(ctx, c, k.FairAcquireKeys(), owner, ms, "1", ms, k.Channel, rediscore.WaiterChannel(fairScriptsPrefix, owner)).Int64Slice()
		if err != nil || len(res) == 0 || res[0] != int64(1-i) {
			t.Fatalf("fair: %s's acquire: %v, %v; want granted %d", owner, res, err, 1-i)
		}
	}
	if got := commands(func() (int, error) {
		return rediscore.FairRelease.Run(ctx, c, k.FairReleaseKeys(), "A", k.Channel, "0", "1").Int()
	}); got != 15 {
		t.Errorf("dlock's fair release ran %d commands on a hand-off, want 15", got)
	}
	if holder, err := c.Get(ctx, k.Lock).Result(); err != nil || holder != "B" {
		t.Fatalf("after the fair release the lock is held by %q (%v), want B: it was not handed over", holder, err)
	}
}
