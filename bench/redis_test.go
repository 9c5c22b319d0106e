package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis"   // redis://
	_ "github.com/dlock-go/dlock/redlock" // redlock://
)

// redisEnv is one single redis-server and five more for Redlock, started for
// one top-level benchmark or test.
type redisEnv struct {
	single *testenv.Redis
	nodes  []*testenv.Redis
	impls  []impl
	// scripts counts the single server's script calls (redisScriptCalls).
	scripts func() (float64, error)
}

func startRedisEnv(tb testing.TB) *redisEnv {
	e := &redisEnv{single: testenv.StartRedis(tb)}
	for range 5 {
		e.nodes = append(e.nodes, testenv.StartRedis(tb))
	}
	one := redisCalls(tb, e.single.Addr())
	e.scripts = redisScriptCalls(tb, e.single.Addr())
	var addrs []string
	var fives []func() (float64, error)
	for _, n := range e.nodes {
		addrs = append(addrs, n.Addr())
		fives = append(fives, redisCalls(tb, n.Addr()))
	}
	five := sumReqs(fives...)
	e.impls = []impl{
		dlockImpl("dlock", e.single.URL(), one),
		dlockImpl("dlock-fair", e.single.URL()+"?fair=true", one),
		{name: "redsync", newLocker: func(tb testing.TB) locker { return newRedsync(tb, e.single.Addr()) }, canWait: true, reqs: one},
		{name: "redislock", newLocker: func(tb testing.TB) locker { return newRedislock(tb, e.single.Addr()) }, canWait: true, reqs: one},
		{name: "floor", newLocker: func(tb testing.TB) locker { return newRedisFloor(tb, e.single.Addr()) }, reqs: one},
		{name: "fenced-floor", newLocker: func(tb testing.TB) locker { return newRedisFencedFloor(tb, e.single.Addr()) }, reqs: one},
		{name: "handoff-floor", newLocker: func(tb testing.TB) locker { return newRedisHandoffFloor(tb, e.single.Addr()) }, canWait: true, handoffOnly: true, reqs: one},
		dlockImpl("dlock-redlock5", "redlock://"+strings.Join(addrs, ","), five),
		{name: "redsync5", newLocker: func(tb testing.TB) locker { return newRedsync(tb, addrs...) }, canWait: true, reqs: five},
	}
	return e
}

// redisCalls returns a reader of the commands the server has executed (INFO
// stats total_commands_processed), without the reader's own INFO calls. Like
// INFO commandstats, it counts a script call and every command the script
// runs: an EVALSHA that runs GET and PEXPIRE is one round trip, three
// commands. redisScriptCalls counts the script calls alone.
func redisCalls(tb testing.TB, addr string) func() (float64, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	var mu sync.Mutex
	reads := 0 // INFO calls so far: each is counted by the next
	return func() (float64, error) {
		mu.Lock()
		defer mu.Unlock()
		s, err := c.Info(context.Background(), "stats").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO stats on %s: %w", addr, err)
		}
		for line := range strings.Lines(s) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO stats on %s: bad line %q", addr, line)
				}
				n -= float64(reads)
				reads++
				return n, nil
			}
		}
		return 0, fmt.Errorf("INFO stats on %s: no total_commands_processed", addr)
	}
}

// redisScriptCalls returns a reader of the script calls the server has
// executed (EVAL, EVALSHA and their _RO forms, FCALL, from INFO
// commandstats): the round trips of a workload made of scripts only, such as
// dlock's renewals.
func redisScriptCalls(tb testing.TB, addr string) func() (float64, error) {
	c := newRedisClient(tb, addr)
	return func() (float64, error) {
		s, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats on %s: %w", addr, err)
		}
		var sum float64
		for line := range strings.Lines(s) {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok {
				continue
			}
			switch name {
			case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
			default:
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.ParseFloat(calls, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO commandstats on %s: bad line %q", addr, line)
			}
			sum += n
		}
		return sum, nil
	}
}

func newRedisClient(tb testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// redsyncLocker is go-redsync/redsync v4 over one pool per address.
type redsyncLocker struct{ rs *redsync.Redsync }

func newRedsync(tb testing.TB, addrs ...string) redsyncLocker {
	var pools []redsyncredis.Pool
	for _, a := range addrs {
		pools = append(pools, redsyncgoredis.NewPool(newRedisClient(tb, a)))
	}
	return redsyncLocker{redsync.New(pools...)}
}

func (r redsyncLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	// Enough tries that a contended Lock does not give up; the retry delay is
	// redsync's default (random 50–250ms).
	m := r.rs.NewMutex(key, redsync.WithExpiry(benchTTL), redsync.WithTries(1_000_000))
	var err error
	if wait {
		err = m.LockContext(ctx)
	} else {
		err = m.TryLockContext(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func() error {
		ok, err := m.UnlockContext(context.Background())
		if err == nil && !ok {
			err = fmt.Errorf("redsync: unlock of %q failed", key)
		}
		return err
	}, nil
}

// redislockRetry is redislock's retry strategy when waiting: the library has
// no default (NoRetry); a 10ms linear backoff is its README's example.
const redislockRetry = 10 * time.Millisecond

type redislockLocker struct{ c *redislock.Client }

func newRedislock(tb testing.TB, addr string) redislockLocker {
	return redislockLocker{redislock.New(newRedisClient(tb, addr))}
}

func (r redislockLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	opt := &redislock.Options{RetryStrategy: redislock.NoRetry()}
	if wait {
		opt.RetryStrategy = redislock.LinearBackoff(redislockRetry)
	}
	l, err := r.c.Obtain(ctx, key, benchTTL, opt)
	if err != nil {
		return nil, err
	}
	return func() error { return l.Release(context.Background()) }, nil
}

// redisFloor is the least any correct Redis lock does: SET NX PX with a random
// owner, then an owner-checked DEL (a script). It cannot wait.
type redisFloor struct{ c *goredis.Client }

var ownerDel = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func newRedisFloor(tb testing.TB, addr string) redisFloor {
	c := newRedisClient(tb, addr)
	if err := ownerDel.Load(context.Background(), c).Err(); err != nil {
		tb.Fatalf("floor: SCRIPT LOAD: %v", err)
	}
	return redisFloor{c}
}

func (f redisFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	owner := backend.NewOwnerID()
	ok, err := f.c.SetNX(ctx, key, owner, benchTTL).Result()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("floor: %q is held", key)
	}
	return ownerRelease(f.c, "floor", key, owner), nil
}

// ownerRelease is the floors' release of lock key: the owner-checked DEL,
// an error if the lock was not owner's. name names the floor in errors.
func ownerRelease(c *goredis.Client, name, key, owner string) func() error {
	return func() error {
		n, err := ownerDel.EvalSha(context.Background(), c, []string{key}, owner).Int()
		if err == nil && n != 1 {
			err = fmt.Errorf("%s: %q was not ours at release", name, key)
		}
		return err
	}
}

// redisFencedFloor is the least a Redis lock with dlock's token takes:
// dlock's own acquire script with only the lock's and the fence's keys — it
// takes the lock (SET NX PX) and, only if granted, draws the token (the
// key's counter plus one, floored at the server's clock in µs, and stored)
// — then the floor's owner-checked DEL. No shared holders are looked at,
// nothing is announced and there is no lease: what the token alone adds to
// the floor. It cannot wait.
type redisFencedFloor struct{ c *goredis.Client }

func newRedisFencedFloor(tb testing.TB, addr string) redisFencedFloor {
	c := newRedisClient(tb, addr)
	for _, s := range []*goredis.Script{rediscore.Acquire, ownerDel} {
		if err := s.Load(context.Background(), c).Err(); err != nil {
			tb.Fatalf("fenced-floor: SCRIPT LOAD: %v", err)
		}
	}
	return redisFencedFloor{c}
}

func (f redisFencedFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("fenced-floor: cannot wait")
	}
	owner := backend.NewOwnerID()
	k := rediscore.KeysFor("fenced-floor:", key)
	res, err := rediscore.Acquire.EvalSha(ctx, f.c, []string{k.Lock, k.Fence}, owner, benchTTL.Milliseconds()).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 2 || res[0] != 1 {
		return nil, fmt.Errorf("fenced-floor: %q is held (%v)", key, res)
	}
	return ownerRelease(f.c, "fenced-floor", k.Lock, owner), nil
}

// redisHandoffFloor is the least a hand-off from one holder to the next
// takes on Redis, with no token and no expiry of waiters (so not a lock to
// use): a waiter that SET NX PX refuses queues its id (RPUSH, in the same
// script) and waits for a message on a channel of its own; the release
// script hands the lock to the head of the queue (SET, and PUBLISH on the
// head's channel) or deletes it. A hand-off is one script and one message;
// the waiter makes no request. It measures what a direct hand-off costs on
// this machine, the reference of dlock's fair mode.
type redisHandoffFloor struct {
	c    *goredis.Client
	id   string
	msgs <-chan *goredis.Message
}

const handoffFloorChannel = "handoff-floor:"

// handoffFloorQueue is the list in which key's waiters queue.
func handoffFloorQueue(key string) string { return key + ":queue" }

var (
	handoffFloorAcquire = goredis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) or redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
if ARGV[3] == '1' then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
return 0`)
	handoffFloorRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 0
end
local head = redis.call('LPOP', KEYS[2])
if head then
  redis.call('SET', KEYS[1], head, 'PX', ARGV[2])
  redis.call('PUBLISH', ARGV[3] .. head, KEYS[1])
else
  redis.call('DEL', KEYS[1])
end
return 1`)
)

func newRedisHandoffFloor(tb testing.TB, addr string) *redisHandoffFloor {
	id := backend.NewOwnerID()
	c, msgs := newRawWaiterClient(tb, addr, "handoff-floor", handoffFloorChannel+id, handoffFloorAcquire, handoffFloorRelease)
	return &redisHandoffFloor{c: c, id: id, msgs: msgs}
}

// newRawWaiterClient returns a client of addr with scripts loaded, and the
// messages of channel, to which it is subscribed once this returns (the
// server has confirmed it): a raw hand-off waiter's client, step naming it in
// errors. tb's cleanup closes the subscription and the client.
func newRawWaiterClient(tb testing.TB, addr, step, channel string, scripts ...*goredis.Script) (*goredis.Client, <-chan *goredis.Message) {
	c := newRedisClient(tb, addr)
	ctx := context.Background()
	for _, sc := range scripts {
		if err := sc.Load(ctx, c).Err(); err != nil {
			tb.Fatalf("%s: SCRIPT LOAD: %v", step, err)
		}
	}
	ps := c.Subscribe(ctx, channel)
	tb.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		tb.Fatalf("%s: SUBSCRIBE: %v", step, err)
	}
	return c, ps.Channel()
}

func (f *redisHandoffFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	keys := []string{key, handoffFloorQueue(key)}
	ms := benchTTL.Milliseconds()
	join := "0"
	if wait {
		join = "1"
	}
	unlock := func() error {
		n, err := handoffFloorRelease.EvalSha(context.Background(), f.c, keys, f.id, ms, handoffFloorChannel).Int()
		if err == nil && n != 1 {
			err = fmt.Errorf("handoff-floor: %q was not ours at release", key)
		}
		return err
	}
	n, err := handoffFloorAcquire.EvalSha(ctx, f.c, keys, f.id, ms, join).Int()
	switch {
	case err != nil:
		return nil, err
	case n == 1:
		return unlock, nil
	case !wait:
		return nil, fmt.Errorf("handoff-floor: %q is held", key)
	}
	for {
		select {
		case m := <-f.msgs:
			if m.Payload == key {
				return unlock, nil
			}
		case <-ctx.Done():
			_ = unlock() // leaves the queue, or passes on a lock handed over meanwhile
			return nil, ctx.Err()
		}
	}
}

// BenchmarkRedis compares, against the same servers in one run, dlock's Redis
// driver, redsync (1 pool), redislock and the raw floor on one redis-server,
// and dlock's Redlock and redsync over five more (5 pools).
//
//   - Uncontended: one try-acquire + release of every implementation per
//     round, rotated (see runUncontended); IMPL.ops/s, IMPL.p50-ns, IMPL.p99-ns.
//   - Contended8/IMPL, Contended32/IMPL: 8 or 32 clients loop lock → unlock
//     on one key (see runContended).
//   - Handoff8/IMPL: the same with 8 clients in rotation: a client that
//     released waits until another got the lock, so every grant is a
//     handoff (how soon a waiter notices a release).
func BenchmarkRedis(b *testing.B) {
	e := startRedisEnv(b)
	benchBackend(b, e.impls)
	b.Run("ServerTime", func(b *testing.B) {
		runServerTime(b, e, b.N)
	})
}

// runServerTime runs n uncontended try-acquire + release cycles of each
// implementation on the single server, one implementation after another, and
// reports the time the server spent running scripts per cycle
// (IMPL.script-us, from INFO commandstats): what the scripts cost inside
// Redis, beside what plain commands would. (The main thread's CPU per cycle,
// from INFO cpu, was tried too: its per-request network work and background
// tasks varied more between runs than the scripts' difference.)
func runServerTime(b *testing.B, e *redisEnv, n int) {
	c := newRedisClient(b, e.single.Addr())
	ctx := context.Background()
	for _, im := range e.impls {
		if strings.HasSuffix(im.name, "5") || im.handoffOnly { // on the five nodes, not the single server
			continue
		}
		l := im.newLocker(b)
		key := uniqueKey("server-time", im.name)
		cycle := func() {
			unlock, err := l.lock(ctx, key, false)
			if err == nil {
				err = unlock()
			}
			if err != nil {
				b.Fatalf("server time: %s: %v", im.name, err)
			}
		}
		cycle() // warm-up: connections, scripts
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatalf("server time: CONFIG RESETSTAT: %v", err)
		}
		for range n {
			cycle()
		}
		report(b, redisScriptUsec(b, c)/float64(n), im.name+".script-us")
	}
}

// redisScriptUsec is the time the server spent running scripts (EVAL,
// EVALSHA and their _RO forms, FCALL) since the last CONFIG RESETSTAT, in µs,
// from INFO commandstats: the commands a script runs included, the reading
// and writing of requests not.
func redisScriptUsec(tb testing.TB, c *goredis.Client) float64 {
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var sum float64
	for line := range strings.Lines(s) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
		default:
			continue
		}
		_, v, _ := strings.Cut(rest, "usec=")
		v, _, _ = strings.Cut(v, ",")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			tb.Fatalf("INFO commandstats: bad line %q", line)
		}
		sum += f
	}
	return sum
}

// benchBackend runs the latency and contention scenarios of one backend.
func benchBackend(b *testing.B, impls []impl) {
	if *flagImpls != "" {
		re, err := regexp.Compile(*flagImpls)
		if err != nil {
			b.Fatalf("-dlock.impls: %v", err)
		}
		impls = slices.DeleteFunc(slices.Clone(impls), func(im impl) bool { return !re.MatchString(im.name) })
	}
	locks := slices.DeleteFunc(slices.Clone(impls), func(im impl) bool { return im.handoffOnly })
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, locks, b.N))
	})
	for _, n := range []int{8, 32} {
		for _, im := range locks {
			if !im.canWait {
				continue
			}
			b.Run("Contended"+strconv.Itoa(n)+"/"+im.name, func(b *testing.B) {
				reportContended(b, runContended(b, im, n, b.N, false))
			})
		}
	}
	for _, im := range impls {
		if !im.canWait {
			continue
		}
		b.Run("Handoff8/"+im.name, func(b *testing.B) {
			reportContended(b, runContended(b, im, 8, b.N, true))
		})
	}
}
