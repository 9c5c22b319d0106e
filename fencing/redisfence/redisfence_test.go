package redisfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/redisfence"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis" // redis:// for the paused holder's locks
)

// quiet drops go-redis's log lines about the restarted server.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	conformance.RegisterGuard("redis-set", open(setTarget))
	conformance.RegisterGuard("redis-hset", open(hsetTarget))
	conformance.RegisterGuard("redis-script", open(scriptTarget))
	conformance.RegisterGuard("redis-cluster-set", open(setTarget))
	conformance.Main(m)
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

// target is a conformance.GuardTarget on one resource: write writes through
// the guard, read reads the value back.
type target struct {
	cli      goredis.UniversalClient
	g        *redisfence.Guard
	resource string
	write    func(ctx context.Context, t *target, tok uint64, v string) error
	read     func(ctx context.Context, t *target) (string, error)
}

func (t *target) key() string { return redisfence.Key(t.resource, ":data") }

func (t *target) Write(ctx context.Context, tok dlock.Token, v string) error {
	return t.write(ctx, t, uint64(tok), v)
}

func (t *target) Read(ctx context.Context) (string, error) {
	v, err := t.read(ctx, t)
	if errors.Is(err, goredis.Nil) {
		return "", nil
	}
	return v, err
}

func (t *target) Close() error { return t.cli.Close() }

func open(kind target) conformance.GuardOpener {
	return func(_ context.Context, addrs, resource string) (conformance.GuardTarget, error) {
		// One address: a *redis.Client; several: a *redis.ClusterClient.
		cli := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: strings.Split(addrs, ",")})
		t := kind
		t.cli, t.g, t.resource = cli, &redisfence.Guard{Client: cli}, resource
		return &t, nil
	}
}

func getData(ctx context.Context, t *target) (string, error) { return t.cli.Get(ctx, t.key()).Result() }

var (
	setTarget = target{
		write: func(ctx context.Context, t *target, tok uint64, v string) error {
			return t.g.Set(ctx, dlock.Token(tok), t.resource, t.key(), v, 0)
		},
		read: getData,
	}
	hsetTarget = target{
		write: func(ctx context.Context, t *target, tok uint64, v string) error {
			return t.g.HSet(ctx, dlock.Token(tok), t.resource, t.key(), "v", v, "n", len(v))
		},
		read: func(ctx context.Context, t *target) (string, error) { return t.cli.HGet(ctx, t.key(), "v").Result() },
	}
	userScript   = redisfence.NewScript(`redis.call('SET', KEYS[1], ARGV[1]); return redis.call('STRLEN', KEYS[1])`)
	scriptTarget = target{
		write: func(ctx context.Context, t *target, tok uint64, v string) error {
			n, err := t.g.Run(ctx, dlock.Token(tok), t.resource, userScript, []string{t.key()}, v)
			if err == nil && n != int64(len(v)) {
				return errors.New("the script's result did not come back")
			}
			return err
		},
		read: getData,
	}
)

// startRedis starts a Redis that logs every write to its append-only file
// before replying, so that the fence survives a kill.
func startRedis(t *testing.T) *testenv.Redis {
	r := testenv.StartRedis(t, testenv.WithPersistence())
	return r
}

func runSuite(t *testing.T, guard string) {
	r := startRedis(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: guard, Server: "redis", Config: r.Addr(), LockDSN: r.URL(),
		Restart: func(testing.TB) { r.Kill(); r.Restart() }, // a crash: appendfsync always keeps the fence
	})
}

func TestGuardSuiteSet(t *testing.T)    { runSuite(t, "redis-set") }
func TestGuardSuiteHSet(t *testing.T)   { runSuite(t, "redis-hset") }
func TestGuardSuiteScript(t *testing.T) { runSuite(t, "redis-script") }

// TestGuardSuiteCluster: on Redis Cluster the fence and the data share a
// slot, by the hash tag, so the script runs; the suite's resources fall on
// different nodes.
func TestGuardSuiteCluster(t *testing.T) {
	cl := testenv.StartCluster(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: "redis-cluster-set", Server: "redis cluster", Config: strings.Join(cl.Addrs(), ","), LockDSN: cl.URL(),
		NotDurable: "the restart case runs on one server (TestGuardSuiteSet); this test proves the hash tag on a cluster",
	})
}

// TestDelFenced: a stale DEL deletes nothing; a current one deletes, and
// leaves the fence.
func TestDelFenced(t *testing.T) {
	r := testenv.StartRedis(t)
	cli := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer cli.Close()
	ctx := context.Background()
	g := &redisfence.Guard{Client: cli}
	a, b := redisfence.Key("job", ":a"), redisfence.Key("job", ":b")
	if err := g.Set(ctx, 5, "job", a, "1", 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(ctx, 5, "job", b, "2", 0); err != nil {
		t.Fatal(err)
	}
	_, err := g.Del(ctx, 4, "job", a, b)
	var se *fencing.StaleTokenError
	if !errors.As(err, &se) || se.Token != 4 || se.Highest != 5 {
		t.Fatalf("Del with token 4 after 5: %v, want a StaleTokenError naming 4 and 5", err)
	}
	if n := cli.Exists(ctx, a, b).Val(); n != 2 {
		t.Fatalf("after the stale DEL %d of 2 keys exist", n)
	}
	if n, err := g.Del(ctx, 6, "job", a, b); err != nil || n != 2 {
		t.Fatalf("Del with token 6 = %d, %v; want 2, nil", n, err)
	}
	if hi, err := g.Highest(ctx, "job"); err != nil || hi != 6 {
		t.Fatalf("Highest = %d, %v; want 6", hi, err)
	}
}

// TestBadKeys: keys without the resource's hash tag, and resources with
// braces, are refused before anything runs; token 0 is stale.
func TestBadKeys(t *testing.T) {
	r := testenv.StartRedis(t)
	cli := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer cli.Close()
	ctx := context.Background()
	g := &redisfence.Guard{Client: cli}
	for _, c := range []struct{ resource, key string }{
		{"job", "job:data"}, {"job", "{other}:data"}, {"", "{}x"}, {"a{b", "{a{b}x"}, {"job", "{}{job}"},
	} {
		if err := g.Set(ctx, 1, c.resource, c.key, "v", 0); !errors.Is(err, redisfence.ErrBadKey) {
			t.Errorf("Set(resource %q, key %q) = %v, want ErrBadKey", c.resource, c.key, err)
		}
	}
	if err := g.Set(ctx, 0, "job", redisfence.Key("job", "x"), "v", 0); !errors.Is(err, fencing.ErrStaleToken) {
		t.Errorf("Set with token 0 = %v, want ErrStaleToken", err)
	}
	if n := cli.DBSize(ctx).Val(); n != 0 {
		t.Errorf("refused writes left %d keys", n)
	}
}
