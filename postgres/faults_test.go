package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
)

// faultHarness breaks one PostgreSQL server: the lockers' link through a
// proxy, and the server itself (SIGKILL of the postmaster and every backend,
// then a restart through crash recovery; SIGSTOP of all of them).
type faultHarness struct {
	*harness
	name string
}

func newFaultHarness(t testing.TB) *faultHarness {
	return &faultHarness{harness: newHarness(t), name: "postgres"}
}

// newSequenceFaultHarness is newFaultHarness with tokens=sequence: its
// lockers, in-process and through the proxy, draw their tokens from the
// sequence and the durable epoch.
func newSequenceFaultHarness(t testing.TB) *faultHarness {
	h := newFaultHarness(t)
	h.name, h.params = "postgres-seq", "&tokens=sequence"
	return h
}

func (h *faultHarness) Deployment() string { return h.name }

// LinkedDSN reaches the server through a new proxy, as the superuser with
// trust authentication (no password needed), in the harness's token mode.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	p := testenv.StartProxy(t, h.srv.Addr())
	return "postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable&connect_timeout=5" + h.params, p
}

// ServerFaults: see postgresMatrix for what each fault does and why.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return conformance.ProcessFaults(h.srv, conformance.Restart)
}

var (
	_ conformance.FaultHarness = (*faultHarness)(nil)
)

// postgresMatrix is the single PostgreSQL server's row of the fault matrix.
var postgresMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no server, so the lease ends at its deadline, reckoned from before the last renewal was sent; the server ends the silent session (idle_session_timeout, the TTL) only a TTL after it answered that renewal, and only then grants the lock"},
	conformance.Disconnect: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the server sees the client die and ends its session at once, freeing the lock, and the holder reads the end off its idle connection at that same moment: a race the holder usually wins by the waiter's fence update and round trip (0.2-5ms here), but no driver can be sure to win, since the server frees a session lock when the connection goes; the Guard fences the old holder when it loses"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before idle_session_timeout ends its session; its writes after SIGCONT are rejected by the Guard"},
	conformance.Restart: {Outcome: conformance.LossDetected,
		Why: "the lock dies with the server's processes (SIGKILL), and the holder reads the end of its session off its connection at once, while a waiter can be granted only after crash recovery; the fence table survives, committed with synchronous_commit=local, so tokens keep increasing"},
	conformance.Stall: {Outcome: conformance.LossDetected,
		Why: "the server stops (SIGSTOP) for 2×TTL: renewals hang and the lease ends at its deadline; the waiter is stalled with the server and is granted only after it resumes and ends the holder's session"},
}

// postgresSequenceMatrix is the row of the same server with tokens=sequence:
// the locks are the same session advisory locks, so every fault but those
// that race a new grant against the old holder (Disconnect) or lose the
// server's memory (Restart) has the same outcome for the same reason.
var postgresSequenceMatrix = conformance.Matrix{
	conformance.Partition:   postgresMatrix[conformance.Partition],
	conformance.PauseHolder: postgresMatrix[conformance.PauseHolder],
	conformance.Stall:       postgresMatrix[conformance.Stall],
	conformance.Disconnect: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the server sees the client die and ends its session at once, freeing the lock, and the holder reads the end off its idle connection at that same moment: a race the holder usually wins by the waiter's round trip, but no driver can be sure to win, since the server frees a session lock when the connection goes; the waiter's token is the epoch and the sequence's next value, above the holder's, and the Guard fences the old holder when it loses"},
	conformance.Restart: {Outcome: conformance.LossDetected,
		Why: "the lock dies with the server's processes (SIGKILL), and the holder reads the end of its session off its connection at once, while a waiter can be granted only after crash recovery; recovery may hand the sequence back values it had already given out (it is not flushed per grant), but it empties the unlogged epoch marker, so the first grant after the crash bumps the durable epoch (a flushed commit) and every later token is above every token of the old server"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), postgresMatrix)
}

func TestFaultsSequenceTokens(t *testing.T) {
	conformance.RunFaults(t, newSequenceFaultHarness(t), postgresSequenceMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: postgresMatrix})
}

// TestSoakSequenceTokens soaks tokens=sequence for 20s by default (the
// default mode's soak, which shares every fault path but the token's,
// takes 45s): -soak or $DLOCK_SOAK lengthens both.
func TestSoakSequenceTokens(t *testing.T) {
	conformance.Soak(t, newSequenceFaultHarness(t), conformance.SoakOptions{Matrix: postgresSequenceMatrix, Duration: 20 * time.Second})
}

// TestWaitOutlivesRestart: a waiting Acquire whose server is killed and
// restarted under it goes on waiting and is granted once the holder's lock
// has died with the old server, with a higher token.
func TestWaitOutlivesRestart(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	a, b := h.NewLocker(t), h.NewLocker(t)
	held, err := a.Acquire(ctx, "restart/wait")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		l, err := b.Acquire(ctx, "restart/wait")
		got <- result{l, err}
	}()
	// The waiter is queued in the server before the crash.
	deadline := time.Now().Add(10 * time.Second)
	for waiters(t, h.srv, "restart/wait") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter is not waiting in the server after 10s")
		}
		time.Sleep(5 * time.Millisecond) // polling pg_locks: no signal exists
	}
	h.srv.Kill()
	h.srv.Restart()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire across a restart: %v", r.err)
	}
	if r.lease.Token() <= held.Token() {
		t.Errorf("token after the restart %d, not above %d", r.lease.Token(), held.Token())
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-held.Done() // lost with the old server
}

// waiters counts the sessions waiting for key's advisory lock.
func waiters(t testing.TB, srv *testenv.Postgres, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connect(t, ctx, srv)
	defer conn.Close(ctx)
	classid, objid, objsubid := postgres.Options{}.AdvisoryKey(key).PgLocks()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3 AND NOT granted`,
		int64(classid), int64(objid), objsubid).Scan(&n); err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	return n
}
