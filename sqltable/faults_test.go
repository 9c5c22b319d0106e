package sqltable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// faultHarness breaks the table lock's deployment: the lockers' link through
// a proxy (in front of the server, or of PgBouncer), and the server itself.
type faultHarness struct {
	*harness
	bouncer *testenv.PgBouncer // nil: the lockers reach the server directly

	mu       sync.Mutex
	restarts int // of a PgBouncer found dead (see alive)
}

// alive restarts PgBouncer, on its port, if it has exited since the last
// trial, and logs why it died. PgBouncer 1.18 (Debian 12's) exits on
// "FATAL … disconnect_client(): bad client state: 0" when a client that sent
// a cancel request disconnects before PgBouncer has forwarded it
// (pgbouncer/pgbouncer#801, fixed upstream by #846): a trial that cuts a
// child's link while pgx cancels a statement can do that. CI saw it kill
// PgBouncer after one trial, and every later trial fail to connect. A
// deployment restarts its pooler (systemd's Restart=); the trial in which it
// crashed still fails on its own, and later trials get a PgBouncer again. It
// can also die as a trial ends, after the next one's check: that trial's
// holder then cannot connect, and its second attempt, on a new LinkedDSN,
// finds PgBouncer restarted.
func (h *faultHarness) alive(t testing.TB) {
	if h.bouncer == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bouncer.Alive() {
		return
	}
	h.restarts++
	t.Logf("pgbouncer had exited (restart %d); the end of its log:\n%s", h.restarts, h.bouncer.LogTail(5))
	if err := h.bouncer.Start(); err != nil {
		t.Fatalf("restarting pgbouncer: %v", err)
	}
}

// NewLocker opens a locker through PgBouncer (or directly), restarting
// PgBouncer first if it crashed.
func (h *faultHarness) NewLocker(t testing.TB) dlock.Locker {
	h.alive(t)
	return h.harness.NewLocker(t)
}

// DSN is the harness's DSN, after restarting PgBouncer if it crashed.
func (h *faultHarness) DSN(t testing.TB) string {
	h.alive(t)
	return h.harness.DSN(t)
}

func newFaultHarness(t testing.TB, bounced bool) *faultHarness {
	h := &faultHarness{harness: newHarness(t)}
	if bounced {
		b := testenv.StartPgBouncer(t, h.srv, "transaction")
		h.bouncer, h.url = b, b.URL()
		// CI runs saw connections through PgBouncer end in EOF: say what
		// became of it. Alive, its log is mostly clients coming and going,
		// and 40 lines of it pushed the test's own errors out of CI's excerpt
		// of the output: the last few lines that are not routine, then.
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			if b.Alive() {
				t.Logf("pgbouncer alive at the end; the last lines of its log that are not clients coming and going:\n%s", b.LogTailExcept(12, routineLog...))
			} else {
				t.Logf("pgbouncer dead at the end; the last lines of its log:\n%s", b.LogTail(40))
			}
		})
	}
	return h
}

// routineLog marks PgBouncer log lines about clients and server connections
// coming and going normally.
var routineLog = []string{"login attempt:", "closing because: client close request", "new connection to server", "closing because: client unexpected eof", "stats:"}

func (h *faultHarness) Deployment() string {
	if h.bouncer != nil {
		return "pgtable-pgbouncer"
	}
	return "pgtable"
}

// LinkedDSN reaches the server (or PgBouncer) through a new proxy, as the
// superuser with trust authentication.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	h.alive(t)
	addr := h.srv.Addr()
	if h.bouncer != nil {
		addr = h.bouncer.Addr()
	}
	p := testenv.StartProxy(t, addr)
	return "pgtable://postgres@" + p.Addr() + "/postgres?sslmode=disable&connect_timeout=5", p
}

// ServerFaults: see tableMatrix.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return conformance.ProcessFaults(h.srv, conformance.Restart)
}

// FailoverTime: after a server restart PgBouncer refuses logins for
// server_login_retry (1s in the test environment; 15s by default).
func (h *faultHarness) FailoverTime() time.Duration {
	if h.bouncer != nil {
		return 2 * time.Second
	}
	return 0
}

var (
	_ conformance.FaultHarness  = (*faultHarness)(nil)
	_ conformance.FailoverTimer = (*faultHarness)(nil)
)

// tableMatrix is the table lock's row of the fault matrix, direct or through
// PgBouncer (which changes nothing: no statement depends on its session).
var tableMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no server, so the lease ends at its deadline, reckoned from before the last renewal was sent less the drift allowance; the row expires by the server's clock a TTL after that renewal ran"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "no session holds the lock: the closed connections change nothing on the server, renewals fail and the lease ends at its deadline, before the row expires"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before its row expires on the server; its writes after SIGCONT are rejected by the Guard"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the row is committed, so it survives the crash (SIGKILL, crash recovery) with its token; the holder keeps the lock unless a renewal falls while the server is down, and then it is told, while the row still keeps the waiter out until it expires"},
	conformance.Stall: {Outcome: conformance.LossDetected,
		Why: "the server stops (SIGSTOP) for 2×TTL: renewals hang and the lease ends at its deadline; the waiter's attempt runs when the server resumes, after the row has expired by its clock"},
}

func TestFaults(t *testing.T) {
	t.Run("direct", func(t *testing.T) { conformance.RunFaults(t, newFaultHarness(t, false), tableMatrix) })
	t.Run("pgbouncer", func(t *testing.T) { conformance.RunFaults(t, newFaultHarness(t, true), tableMatrix) })
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t, true), conformance.SoakOptions{Matrix: tableMatrix})
}

// A PgBouncer that died between trials (as 1.18 does on a cancel request
// cut short) is started again before the next trial opens a locker, which
// then reaches the server through it.
func TestFaultHarnessRestartsDeadBouncer(t *testing.T) {
	h := newFaultHarness(t, true)
	h.bouncer.Kill()
	if h.bouncer.Alive() {
		t.Fatal("pgbouncer still alive after Kill")
	}
	l := h.NewLocker(t)
	lease, err := l.TryAcquire(context.Background(), "after-bouncer-restart")
	if err != nil {
		t.Fatalf("TryAcquire through the restarted pgbouncer: %v", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.restarts != 1 {
		t.Errorf("restarts = %d, want 1", h.restarts)
	}
}
