package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/migrate"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{}) // the refusal tests dial closed ports on purpose
	goleak.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// servers is one Redis and one etcd server, with raw clients for reaching
// behind the lockers' backs.
type servers struct {
	redisURL string
	etcdEP   string
	rdb      *goredis.Client
	cli      *clientv3.Client
}

func startServers(t *testing.T) *servers {
	t.Helper()
	r := testenv.StartRedis(t)
	e := testenv.StartEtcd(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return &servers{redisURL: r.URL(), etcdEP: e.Endpoint(), rdb: rdb, cli: cli}
}

// env is one migration: an old (Redis) and a new (etcd) backend, each under
// its own prefix, so tests sharing servers do not share records.
type env struct {
	*servers
	redisPrefix, etcdPrefix string
	newBase                 string // the new backend's DSN without its prefix; etcd's if ""
}

var envSeq atomic.Int64

func newEnv(s *servers) *env {
	n := envSeq.Add(1)
	return &env{servers: s, redisPrefix: fmt.Sprintf("m%d:", n), etcdPrefix: fmt.Sprintf("/m%d", n)}
}

func (e *env) from() string { return e.redisURL + "?prefix=" + e.redisPrefix }
func (e *env) to() string {
	if e.newBase != "" {
		return e.newBase + e.etcdPrefix
	}
	return "etcd://" + e.etcdEP + e.etcdPrefix
}
func (e *env) dsn(mode string) string {
	return migrate.DSN(e.from(), e.to(), mode)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t testing.TB, dsn string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(ctxT(t), dsn, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func (e *env) switchTokens(t testing.TB) *migrate.Record {
	t.Helper()
	rec, created, err := migrate.Switch(ctxT(t), e.from(), e.to(), nil)
	if err != nil || !created {
		t.Fatalf("Switch: created=%v, %v", created, err)
	}
	return rec
}

// harness runs the conformance suite on migrate:// lockers of one mode.
type harness struct {
	*env
	mode string
	zk   *zk.Conn // the new backend is ZooKeeper (e.newBase), reached through this
}

// expireZK deletes the node of key's holder: its next renewal finds it gone.
func (h *harness) expireZK(t testing.TB, key string) {
	t.Helper()
	dir := zookeeper.LockPath(h.etcdPrefix, key)
	kids, _, err := h.zk.Children(dir)
	if err != nil || len(kids) == 0 {
		t.Fatalf("Expire(%q): lock nodes under %s: %v %v", key, dir, kids, err)
	}
	seq := func(n string) string { return n[len(n)-10:] }
	slices.SortFunc(kids, func(a, b string) int { return strings.Compare(seq(a), seq(b)) })
	if err := h.zk.Delete(dir+"/"+kids[0], -1); err != nil {
		t.Fatalf("Expire(%q): delete the holder's node: %v", key, err)
	}
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker { return open(t, h.dsn(h.mode)) }

// Expire makes both backends forget key's holder: DEL of the Redis lock key,
// revocation of the etcd holder's lease.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx := ctxT(t)
	if h.mode == migrate.ModeMigrate {
		if n, err := h.rdb.Del(ctx, redis.LockKey(h.redisPrefix, key)).Result(); err != nil || n != 1 {
			t.Fatalf("Expire(%q): DEL the Redis lock: n=%d, %v", key, n, err)
		}
	}
	if h.zk != nil {
		h.expireZK(t, key)
		return
	}
	resp, err := h.cli.Get(ctx, etcd.LockName(h.etcdPrefix, key)+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("Expire(%q): etcd holder: %v (%d keys)", key, err, len(resp.Kvs))
	}
	if _, err := h.cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatalf("Expire(%q): revoke: %v", key, err)
	}
}

// ShortTTL is etcd's shortest lease.
func (*harness) ShortTTL() time.Duration { return 2 * time.Second }

// TestConformance runs the suite in each mode one after another, not in
// parallel: CloseStopsGoroutines counts the process's goroutines, which
// another suite's running beside it changes (a CI-like run failed it so).
func TestConformance(t *testing.T) {
	s := startServers(t)
	t.Run("before-switch", func(t *testing.T) {
		conformance.Run(t, &harness{env: newEnv(s), mode: migrate.ModeMigrate})
	})
	t.Run("after-switch", func(t *testing.T) {
		e := newEnv(s)
		e.switchTokens(t)
		conformance.Run(t, &harness{env: e, mode: migrate.ModeMigrate})
	})
	t.Run("new-only", func(t *testing.T) {
		e := newEnv(s)
		e.switchTokens(t)
		conformance.Run(t, &harness{env: e, mode: migrate.ModeNew})
	})
	t.Run("zookeeper-after-switch", func(t *testing.T) {
		e := newEnv(s)
		srv := testenv.StartZooKeeper(t)
		e.newBase = "zk://" + srv.Addr()
		conn, _, err := zk.Connect([]string{srv.Addr()}, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		e.switchTokens(t)
		conformance.Run(t, &harness{env: e, mode: migrate.ModeMigrate, zk: conn})
	})
}

// TestMixedFleet runs Redis-only, migrating and new-only lockers in the
// allowed combinations on the same keys, through one fencing Guard, with the
// switch flipped mid-run: Redis-only + migrating, then (Redis-only stopped)
// the switch, then migrating + new-only. Every write must be accepted with a
// token above the previous one (Guard.Advance), no two holders may overlap,
// and a stale token from before the switch must be rejected after it.
func TestMixedFleet(t *testing.T) {
	t.Run("etcd", func(t *testing.T) { mixedFleet(t, newEnv(startServers(t))) })
	t.Run("zookeeper", func(t *testing.T) {
		e := newEnv(startServers(t))
		e.newBase = "zk://" + testenv.StartZooKeeper(t).Addr()
		mixedFleet(t, e)
	})
}

func mixedFleet(t *testing.T, e *env) {
	ctx := ctxT(t)
	keys := []string{"fleet/a", "fleet/b"}
	const perPhase = 40 // grants per key per phase

	var guard fencing.Guard
	var (
		mu      sync.Mutex
		tokens  = map[string][]dlock.Token{} // per key, in grant order
		holders = map[string]*atomic.Int32{}
		grants  = map[string]int{} // all grants
		mapped  = map[string]int{} // grants with a token above the switch's base
		base    atomic.Uint64      // the switch's base, once switched
	)
	for _, k := range keys {
		holders[k] = new(atomic.Int32)
	}
	phaseDone := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var closeOnce [2]sync.Once
	work := func(ctx context.Context, l dlock.Locker, kind string, i int) error {
		key := keys[i%len(keys)]
		lease, err := l.Acquire(ctx, key, dlock.WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer lease.Release(context.Background())
		if n := holders[key].Add(1); n != 1 {
			t.Errorf("%s: %d holders of %q at once", kind, n, key)
		}
		err = guard.Advance(key, lease.Token(), func() error {
			mu.Lock()
			defer mu.Unlock()
			tokens[key] = append(tokens[key], lease.Token())
			grants[key]++
			b := base.Load()
			if b != 0 && uint64(lease.Token()) > b {
				mapped[key]++
			}
			p, count := 0, grants
			if b != 0 {
				p, count = 1, mapped
			}
			done := true
			for _, k := range keys {
				done = done && count[k] >= perPhase
			}
			if done {
				closeOnce[p].Do(func() { close(phaseDone[p]) })
			}
			return nil
		})
		holders[key].Add(-1)
		if err != nil {
			t.Errorf("%s: write with token %v on %q rejected: %v", kind, lease.Token(), key, err)
		}
		return nil
	}
	run := func(ctx context.Context, wg *sync.WaitGroup, l dlock.Locker, kind string, seed int) {
		wg.Go(func() {
			for i := seed; ctx.Err() == nil; i++ {
				if err := work(ctx, l, kind, i); err != nil && ctx.Err() == nil {
					t.Errorf("%s: %v", kind, err)
					return
				}
			}
		})
	}

	// New-only clients are refused before the switch.
	if _, err := dlock.Open(ctx, e.dsn(migrate.ModeNew)); !errors.Is(err, migrate.ErrNotSwitched) {
		t.Fatalf("new-only Open before the switch: %v, want ErrNotSwitched", err)
	}

	allCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var all sync.WaitGroup
	defer all.Wait()
	for i := range 2 {
		run(allCtx, &all, open(t, e.dsn("")), "migrating", i)
	}
	redisCtx, stopRedis := context.WithCancel(allCtx)
	var redisOnly sync.WaitGroup
	for i := range 2 {
		run(redisCtx, &redisOnly, open(t, e.from()), "redis-only", i+1)
	}
	select {
	case <-phaseDone[0]:
	case <-ctx.Done():
		t.Fatal("phase 1 did not finish")
	}
	stopRedis()
	redisOnly.Wait()
	mu.Lock()
	lastOld := map[string]dlock.Token{}
	for _, k := range keys {
		lastOld[k] = tokens[k][len(tokens[k])-1]
	}
	mu.Unlock()

	rec := e.switchTokens(t)
	base.Store(rec.Base)
	for i := range 2 {
		run(allCtx, &all, open(t, e.dsn(migrate.ModeNew)), "new-only", i)
	}
	select {
	case <-phaseDone[1]:
	case <-ctx.Done():
		t.Fatal("phase 2 did not finish")
	}
	stopAll()
	all.Wait()

	straggler := open(t, e.from())
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		ts := tokens[k]
		for i := 1; i < len(ts); i++ {
			if ts[i] <= ts[i-1] {
				t.Errorf("%q: token %d (%v) not above token %d (%v)", k, i, ts[i], i-1, ts[i-1])
			}
		}
		if mapped[k] < perPhase {
			t.Errorf("%q: only %d grants with mapped tokens after the switch, want ≥ %d", k, mapped[k], perPhase)
		}
		// A holder from before the switch that wakes up now is fenced off.
		if err := guard.Do(k, lastOld[k], func() error { return nil }); !errors.Is(err, fencing.ErrStaleToken) {
			t.Errorf("%q: stale pre-switch token %v accepted after the switch: %v", k, lastOld[k], err)
		}
		// So is a Redis-only client wrongly left running after the switch
		// (docs/MIGRATING.md, "What breaks"): its tokens stay below the base.
		lease, err := straggler.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := guard.Do(k, lease.Token(), func() error { return nil }); !errors.Is(err, fencing.ErrStaleToken) {
			t.Errorf("%q: Redis-only token %v after the switch accepted: %v", k, lease.Token(), err)
		}
		_ = lease.Release(ctx)
		t.Logf("%q: %d grants, %d mapped; last Redis token %v, last token %v", k, len(ts), mapped[k], lastOld[k], ts[len(ts)-1])
	}
}

// TestRefusals covers what the package detects and refuses.
func TestRefusals(t *testing.T) {
	s := startServers(t)
	ctx := ctxT(t)

	t.Run("new-only-before-switch", func(t *testing.T) {
		e := newEnv(s)
		_, err := dlock.Open(ctx, e.dsn(migrate.ModeNew))
		if !errors.Is(err, migrate.ErrNotSwitched) {
			t.Fatalf("Open: %v, want ErrNotSwitched", err)
		}
		if _, err := migrate.ReadSwitch(ctx, e.to()); !errors.Is(err, migrate.ErrNotSwitched) {
			t.Fatalf("ReadSwitch: %v, want ErrNotSwitched", err)
		}
	})

	t.Run("other-old-backend", func(t *testing.T) {
		e := newEnv(s)
		e.switchTokens(t)
		other := "redis://127.0.0.1:1/0?prefix=" + e.redisPrefix
		_, err := dlock.Open(ctx, migrate.DSN(other, e.to(), ""))
		if !errors.Is(err, migrate.ErrMismatch) || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Fatalf("Open with another old backend: %v, want ErrMismatch naming it", err)
		}
		_, err = dlock.Open(ctx, migrate.DSN(other, e.to(), migrate.ModeNew))
		if !errors.Is(err, migrate.ErrMismatch) {
			t.Fatalf("new-only Open with another old backend: %v, want ErrMismatch", err)
		}
		if _, _, err := migrate.Switch(ctx, other, e.to(), nil); !errors.Is(err, migrate.ErrMismatch) {
			t.Fatalf("second Switch for another old backend: %v, want ErrMismatch", err)
		}
		// The same old backend, written differently: the switch is idempotent.
		rec, created, err := migrate.Switch(ctx, strings.Replace(e.from(), "/0?", "?", 1), e.to(), nil)
		if err != nil || created || rec == nil {
			t.Fatalf("second Switch for the same backend: %v, created=%v", err, created)
		}
		// A new-only client without from does not check it.
		l := open(t, migrate.DSN("", e.to(), migrate.ModeNew))
		lease, err := l.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if uint64(lease.Token()) <= rec.Base {
			t.Errorf("token %v not above the base %d", lease.Token(), rec.Base)
		}
		_ = lease.Release(ctx)
	})

	t.Run("bad-dsn", func(t *testing.T) {
		e := newEnv(s)
		for _, c := range []struct{ dsn, want string }{
			{"migrate://?from=" + e.from(), `"to"`},
			{"migrate://?to=" + e.to(), `"from"`},
			{e.dsn("old"), `mode="old"`},
			{e.dsn("") + "&x=1", `"x"`},
			{"migrate://host/?to=" + e.to(), "no host"},
			{migrate.DSN(e.from()+"&ttl=5s", e.to(), ""), "put ttl=5s on the migrate:// DSN"},
			{migrate.DSN(e.dsn(""), e.to(), ""), "cannot nest"},
			{migrate.DSN(e.from(), e.redisURL, ""), "must be etcd"},
		} {
			_, err := dlock.Open(ctx, c.dsn)
			if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open(%s): %v, want ErrInvalidOption mentioning %s", c.dsn, err, c.want)
			}
		}
	})

	t.Run("passwords-never-shown", func(t *testing.T) {
		e := newEnv(s)
		for _, dsn := range []string{
			migrate.DSN("redis://u:s3cret@127.0.0.1:1/0", e.to(), ""),
			migrate.DSN(e.from(), "etcd://u:s3cret@127.0.0.1:1/x?dial-timeout=200ms", ""),
			migrate.DSN("redis://u:s3cret@[::1/0", e.to(), ""),
		} {
			_, err := dlock.Open(ctx, dsn)
			if err == nil || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Open: %v", err)
			}
		}
		_, _, err := migrate.Switch(ctx, "postgres://u:s3cret@127.0.0.1:1/db", e.to(), nil)
		if !errors.Is(err, dlock.ErrInvalidOption) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Switch from postgres without a base: %v, want ErrInvalidOption without the password", err)
		}
	})

	t.Run("switch-check", func(t *testing.T) {
		// With a 1µs margin the second probe's token (strictly above the
		// first) always reaches the base: Switch must say so.
		e := newEnv(s)
		_, created, err := migrate.Switch(ctx, e.from(), e.to(), &migrate.SwitchOptions{Margin: time.Microsecond})
		if !created || !errors.Is(err, migrate.ErrTokenBackwards) {
			t.Fatalf("Switch with a 1µs margin: created=%v, %v; want the record written and ErrTokenBackwards", created, err)
		}
		if _, _, err := migrate.Switch(ctx, e.from(), e.to(), &migrate.SwitchOptions{Margin: -time.Second}); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Switch with a negative margin: %v", err)
		}
	})

	t.Run("explicit-base", func(t *testing.T) {
		// An old backend without clock-floored tokens: the operator gives the
		// base, and nothing connects to the old backend.
		e := newEnv(s)
		from := "postgres://u:s3cret@127.0.0.1:1/db"
		rec, created, err := migrate.Switch(ctx, from, e.to(), &migrate.SwitchOptions{Base: 1_000_000})
		if err != nil || !created || rec.Base != 1_000_000 || rec.From != "postgres://127.0.0.1:1/db" {
			t.Fatalf("Switch with a base: %+v, created=%v, %v", rec, created, err)
		}
		got, err := migrate.ReadSwitch(ctx, e.to())
		if err != nil || *got != *rec {
			t.Fatalf("ReadSwitch = %+v, %v; want %+v", got, err, rec)
		}
		l := open(t, migrate.DSN("", e.to(), migrate.ModeNew))
		lease, err := l.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if uint64(lease.Token()) <= rec.Base {
			t.Errorf("token %v not above the base", lease.Token())
		}
		_ = lease.Release(ctx)
	})

	t.Run("corrupt-base", func(t *testing.T) {
		e := newEnv(s)
		e.switchTokens(t)
		l := open(t, e.dsn(migrate.ModeNew))
		baseKey := etcd.LockName(e.etcdPrefix+".migrate/base", "k")
		if _, err := s.cli.Put(ctx, baseKey, strconv.FormatUint(math.MaxUint64-3, 10)); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, migrate.ErrTokenBackwards) {
			t.Fatalf("Acquire with a base near 2^64: %v, want ErrTokenBackwards", err)
		}
		if _, err := s.cli.Put(ctx, baseKey, "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, migrate.ErrMismatch) {
			t.Fatalf("Acquire with an unreadable base: %v, want ErrMismatch", err)
		}
		// Nothing is left held: a TryAcquire on the key succeeds.
		if _, err := s.cli.Delete(ctx, baseKey); err != nil {
			t.Fatal(err)
		}
		lease, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("TryAcquire after the refusals: %v", err)
		}
		_ = lease.Release(ctx)
	})
}

// TestOldCounterAheadOfBase covers the general case the switch-time base does
// not: an old counter above the base (a Redis clock that stepped back, a
// failover). The migrating grant raises the key's base above it and records
// it, so the new-only grant after it maps above it too.
func TestOldCounterAheadOfBase(t *testing.T) {
	e := newEnv(startServers(t))
	ctx := ctxT(t)
	rec := e.switchTokens(t)
	ahead := rec.Base + 1_000_000_000
	if err := e.rdb.Set(ctx, redis.FenceKey(e.redisPrefix, "k"), ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	var last dlock.Token
	for _, mode := range []string{migrate.ModeMigrate, migrate.ModeNew, migrate.ModeMigrate} {
		l := open(t, e.dsn(mode))
		lease, err := l.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if lease.Token() <= last || uint64(lease.Token()) <= ahead {
			t.Errorf("%s: token %v, want above %v and the old counter %d", mode, lease.Token(), last, ahead)
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLossOfEitherLock checks the composite lease is lost when either inner
// lock is, and that Capabilities are the weaker of the two.
func TestLossOfEitherLock(t *testing.T) {
	e := newEnv(startServers(t))
	etcdOnly := &harness{env: e, mode: migrate.ModeNew} // its Expire revokes the etcd lease only
	ctx := ctxT(t)
	l := open(t, e.dsn(""))
	c := l.Capabilities()
	if c.FIFO || c.FaultTolerant || !c.PushWait || c.LossNotify {
		t.Errorf("capabilities %+v: want those of Redis (not FIFO, not fault tolerant, push wait, no loss notify)", c)
	}
	for _, which := range []string{"old", "new"} {
		lease, err := l.Acquire(ctx, "loss/"+which)
		if err != nil {
			t.Fatal(err)
		}
		if which == "old" {
			// DEL the Redis lock; the next renewal finds it gone.
			if err := e.rdb.Del(ctx, redis.LockKey(e.redisPrefix, lease.Key())).Err(); err != nil {
				t.Fatal(err)
			}
			if err := lease.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Errorf("Refresh after the old lock was deleted: %v, want ErrLeaseLost", err)
			}
		} else {
			etcdOnly.Expire(t, lease.Key())
		}
		select {
		case <-lease.Done():
		case <-ctx.Done():
			t.Fatalf("%s lock lost: Done not closed", which)
		}
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Errorf("%s lock lost: Err = %v, want ErrLeaseLost", which, lease.Err())
		}
		// The other lock is released: another client gets both.
		l2 := open(t, e.dsn(""))
		l2lease, err := l2.Acquire(ctx, lease.Key())
		if err != nil {
			t.Fatalf("%s lock lost: Acquire after: %v", which, err)
		}
		_ = l2lease.Release(ctx)
	}
}

// TestNewOnlyFirstAfterSwitch: a key whose first grant after the switch is a
// new-only client's — which never talks to Redis — still gets a token above
// the key's last Redis token, from the switch's base alone.
func TestNewOnlyFirstAfterSwitch(t *testing.T) {
	e := newEnv(startServers(t))
	ctx := ctxT(t)
	var last [2]dlock.Token
	for i, dsn := range []string{e.from(), e.dsn("")} { // Redis-only, then migrating
		lease, err := open(t, dsn).Acquire(ctx, "fresh")
		if err != nil {
			t.Fatal(err)
		}
		last[i] = lease.Token()
		_ = lease.Release(ctx)
	}
	rec := e.switchTokens(t)
	lease, err := open(t, migrate.DSN("", e.to(), migrate.ModeNew)).Acquire(ctx, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if last[1] <= last[0] || lease.Token() <= last[1] || uint64(lease.Token()) <= rec.Base {
		t.Errorf("tokens %v (Redis-only), %v (migrating), %v (new-only, base %d): not increasing", last[0], last[1], lease.Token(), rec.Base)
	}
}
