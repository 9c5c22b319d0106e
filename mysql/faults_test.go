package mysql_test

import (
	"testing"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// faultHarness breaks one MariaDB server: the lockers' link through a proxy,
// and the server itself (SIGKILL then a restart through InnoDB's crash
// recovery; SIGSTOP).
type faultHarness struct{ *harness }

func (h faultHarness) Deployment() string {
	if h.params != "" {
		return "mysql-seq"
	}
	return "mysql"
}

// LinkedDSN reaches the server through a new proxy, as root without a
// password.
func (h faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	p := testenv.StartProxy(t, h.srv.Addr())
	return "mysql://root@" + p.Addr() + "/mysql?timeout=5s" + h.params, p
}

// ServerFaults: see mysqlMatrix.
func (h faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return conformance.ProcessFaults(h.srv, conformance.Restart)
}

var _ conformance.FaultHarness = faultHarness{}

// mysqlMatrix is the MySQL/MariaDB GET_LOCK driver's row of the fault
// matrix.
var mysqlMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no server, so the lease ends at its deadline, reckoned from before the last renewal was sent; the server ends the silent session (wait_timeout, the TTL rounded up to a second) only that long after it answered that renewal, and only then grants the lock"},
	conformance.Disconnect: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the server sees the connection close and ends the session at once, freeing the lock; the holder reads the close off its idle connection within 50ms (the watcher's poll), while a waiter is granted within a round trip and a commit: the waiter usually wins, and its higher token lets the Guard fence the old holder"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before wait_timeout ends its session; its writes after SIGCONT are rejected by the Guard"},
	conformance.Restart: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the lock dies with the server (SIGKILL) and the kernel closes its connections: the holder reads the close off its idle connection within 50ms, while a waiter is granted only after the restart and crash recovery; were it faster, its token is higher (the fence table is committed with innodb_flush_log_at_trx_commit=1) and the Guard fences the old holder"},
	conformance.Stall: {Outcome: conformance.LossDetected,
		Why: "the server stops (SIGSTOP) for 2×TTL: renewals hang and the lease ends at its deadline; the waiter is stalled with the server and is granted only after it resumes and ends the holder's session"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, faultHarness{newHarness(t)}, mysqlMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, faultHarness{newHarness(t)}, conformance.SoakOptions{Matrix: mysqlMatrix})
}
