package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// faultHarness breaks one redis-server: its lockers' links through a proxy,
// the server itself (kill and restart, SIGSTOP), and the lock key behind the
// holder's back (the effect of a clock jump on the server).
type faultHarness struct {
	*harness
	srv    *testenv.Redis
	name   string
	aof    bool   // the server has appendonly yes, appendfsync always
	params string // added to LinkedDSN's DSN: the lockers' mode, as h.opts sets it
}

// newFaultHarness starts the server of deployment name: "redis", "redis-aof"
// (with an AOF) or "redis-fair" (lockers in fair mode).
func newFaultHarness(t testing.TB, name string) *faultHarness {
	var opts []testenv.RedisOption
	aof := name == "redis-aof"
	if aof {
		opts = append(opts, testenv.WithPersistence())
	}
	srv := testenv.StartRedis(t, opts...)
	h := &faultHarness{harness: newHarnessDial(t, func() goredis.UniversalClient {
		return goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	}), srv: srv, name: name, aof: aof}
	if name == "redis-fair" {
		h.opts, h.params = &redis.Options{Fair: true}, "&fair=true"
	}
	return h
}

func (h *faultHarness) Deployment() string { return h.name }

// LinkedDSN reaches the server through a new proxy. The driver's startup
// checks are off: the server deliberately runs without persistence.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	p := testenv.StartProxy(t, h.srv.Addr())
	return "redis://" + p.Addr() + "/0?checks=off&dial_timeout=1s" + h.params, p
}

// ServerFaults: the server restarts (from its AOF, or empty without one),
// stalls, or jumps its clock.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	restart := conformance.RestartEmpty
	if h.aof {
		restart = conformance.Restart
	}
	faults := conformance.ProcessFaults(h.srv, restart)
	// A forward jump of the server's clock past the key's expiry: the key
	// expires now (DEL, not PEXPIRE 1, which a renewal landing within that
	// millisecond would undo). The fence counter is untouched (its floor,
	// the server's clock, would jump forward too). In a soak the key may
	// have been released meanwhile: no key, no jump.
	faults[conformance.ClockJump] = func(t testing.TB, key string) func() {
		lk := redis.LockKey(redis.DefaultPrefix, key)
		if err := h.raw.Del(context.Background(), lk).Err(); err != nil {
			t.Fatalf("ClockJump: DEL %s: %v", lk, err)
		}
		return func() {}
	}
	return faults
}

// redisMatrix is the single redis-server's row of the fault matrix.
var redisMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals time out at the lease's deadline, which comes before the key's expiry on the server (validity less drift)"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "the first renewal after the cut fails at once; the key outlives the holder's deadline on the server"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before the key expires on the server; its write after SIGCONT is rejected by the Guard"},
	conformance.RestartEmpty: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the lock key dies with the server's memory and a waiter may be granted before the holder's next renewal fails; the fence counter dies too, but new tokens are floored at the server's µs clock, so they are higher and the Guard rejects the old holder"},
	conformance.Stall: {Outcome: conformance.LossDetected,
		Why: "renewals time out at the deadline; the key has expired by the server's clock when it resumes"},
	conformance.ClockJump: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the key expires early and a waiter may be granted before the holder's next renewal fails; the fence counter survives, so the Guard rejects the old holder"},
}

// redisAOFMatrix is the row of a redis-server with appendonly yes, appendfsync
// always.
var redisAOFMatrix = conformance.Matrix{
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the key and the counter survive in the AOF; the holder keeps the lock unless a renewal falls while the server is down, and then it is told first"},
}

// redisFairMatrix is the row of the same server with lockers in fair mode:
// the lock key, its expiry and the fence are the default mode's, so a fault
// ends the holder's lease as it does there; what differs is how the next
// holder is let in (handed the lock by a release, or taking it with its own
// call once the key expired or vanished), and that the queue is lost with
// the key on a restart.
var redisFairMatrix = conformance.Matrix{
	conformance.Partition:   redisMatrix[conformance.Partition],
	conformance.Disconnect:  redisMatrix[conformance.Disconnect],
	conformance.PauseHolder: redisMatrix[conformance.PauseHolder],
	conformance.Stall:       redisMatrix[conformance.Stall],
	conformance.RestartEmpty: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the lock key, the queue and the fence counter die with the server's memory; the waiter joins a new queue and takes the free lock with its next call, which may come before the holder's next renewal fails; new tokens are floored at the server's µs clock, so they are higher and the Guard rejects the old holder"},
	conformance.ClockJump: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the key expires early, with no release to hand it over: the head of the queue takes it with its next call (its poll), which may come before the holder's next renewal fails; the fence counter survives, so the Guard rejects the old holder"},
}

func TestFaults(t *testing.T) {
	t.Run("redis", func(t *testing.T) { conformance.RunFaults(t, newFaultHarness(t, "redis"), redisMatrix) })
	t.Run("redis-aof", func(t *testing.T) { conformance.RunFaults(t, newFaultHarness(t, "redis-aof"), redisAOFMatrix) })
	t.Run("redis-fair", func(t *testing.T) { conformance.RunFaults(t, newFaultHarness(t, "redis-fair"), redisFairMatrix) })
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t, "redis"), conformance.SoakOptions{Matrix: redisMatrix})
}

// TestSoakFair soaks fair mode for 20s by default (the default mode's soak
// takes 45s): -soak or $DLOCK_SOAK lengthens both.
func TestSoakFair(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t, "redis-fair"), conformance.SoakOptions{Matrix: redisFairMatrix, Duration: 20 * time.Second})
}
