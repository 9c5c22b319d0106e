package bench

import (
	"context"
	"fmt"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
	"github.com/dlock-go/dlock/internal/testenv"
)

// BenchmarkRedisSteps takes dlock's uncontended Redis cycle apart, step by
// step from the raw floor, all interleaved round by round on one server
// (scripts/bench.sh runs it with -benchtime 5s -count 3):
//
//   - floor, fenced-floor: as in BenchmarkRedis;
//   - scripts: the driver's own two scripts on a raw client, with every key
//     and argument the driver sends (the shared holders' check, the
//     announcements of the grant and the release, dlock's default label in
//     the lock's value), and nothing else: what the server adds to the
//     fenced floor;
//   - driver: the redis driver called as the Locker calls it, without one;
//   - dlock: dlock.Open.
//
// Reported as BenchmarkRedis's uncontended scenario (IMPL.ops/s,
// IMPL.p50-ns, …).
func BenchmarkRedisSteps(b *testing.B) {
	srv := testenv.StartRedis(b)
	addr := srv.Addr()
	impls := []impl{
		{name: "floor", newLocker: func(tb testing.TB) locker { return newRedisFloor(tb, addr) }},
		{name: "fenced-floor", newLocker: func(tb testing.TB) locker { return newRedisFencedFloor(tb, addr) }},
		{name: "scripts", newLocker: func(tb testing.TB) locker { return newRedisScripts(tb, addr) }},
		{name: "driver", newLocker: func(tb testing.TB) locker { return openDriver(tb, srv.URL()) }},
		dlockImpl("dlock", srv.URL(), nil),
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}

// redisScripts runs the redis driver's acquire and release scripts as its
// uncontended try-acquire and release send them, on a raw client. It cannot
// wait.
type redisScripts struct{ c *goredis.Client }

func newRedisScripts(tb testing.TB, addr string) redisScripts {
	c := newRedisClient(tb, addr)
	for _, s := range []*goredis.Script{rediscore.Acquire, rediscore.Release} {
		if err := s.Load(context.Background(), c).Err(); err != nil {
			tb.Fatalf("scripts: SCRIPT LOAD: %v", err)
		}
	}
	return redisScripts{c}
}

func (r redisScripts) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("scripts: cannot wait")
	}
	owner := rediscore.HolderValue(backend.NewOwnerID(), dlock.DefaultLabel)
	k := rediscore.KeysFor("scripts:", key)
	res, err := rediscore.Acquire.EvalSha(ctx, r.c, k.SharedKeys(), owner, benchTTL.Milliseconds(), "-", k.Channel, "", "0").Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 2 || res[0] != 1 {
		return nil, fmt.Errorf("scripts: %q is held (%v)", key, res)
	}
	return func() error {
		n, err := rediscore.Release.EvalSha(context.Background(), r.c, []string{k.Lock}, owner, k.Channel).Int()
		if err == nil && n != 1 {
			err = fmt.Errorf("scripts: %q was not ours at release", key)
		}
		return err
	}, nil
}
