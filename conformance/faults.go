package conformance

import (
	"strings"
	"testing"
)

// Fault names one way the world goes wrong around a lock holder. RunFaults
// injects each fault into trials of a holder and a contender on one key and
// classifies what happened as an Outcome.
type Fault string

// The faults the suite knows. Link faults and pauses (and the cells that
// repeat them) need only FaultHarness.LinkedDSN; server faults need an
// Injector in FaultHarness.ServerFaults.
const (
	// Partition blackholes the holder's link to every server for longer than
	// the TTL: no byte passes either way and no connection closes, so the
	// servers still see an idle client. Healed afterwards.
	Partition Fault = "partition"

	// Disconnect closes the holder's connections and refuses new ones for
	// longer than the TTL, so the servers see the client die (FIN/RST) — the
	// variant where the proxy also drops its upstream. Healed afterwards.
	Disconnect Fault = "disconnect"

	// PauseHolder runs the holder as a child process (the test binary
	// re-executed, see Main) and stops it with SIGSTOP for longer than the TTL,
	// then resumes it with SIGCONT: a GC or VM pause.
	PauseHolder Fault = "pause-holder"

	// LeaderPartition is Partition with the holder an election's leader
	// (Run) and the contender a candidate (Campaign). Without a cell of its
	// own it has Partition's claim.
	LeaderPartition Fault = "leader-partition"

	// LeaderPause is PauseHolder with the holder a leader, as
	// LeaderPartition is Partition.
	LeaderPause Fault = "leader-pause"

	// SemaphorePartition is Partition with the holder and the contender
	// taking the one permit of a semaphore of 1. Without a cell of its own
	// it has Partition's claim.
	SemaphorePartition Fault = "semaphore-partition"

	// SemaphorePause is PauseHolder with a permit, as SemaphorePartition is
	// Partition.
	SemaphorePause Fault = "semaphore-pause"

	// WriterPartition is Partition with the holder and the contender taking
	// the write side of a read/write lock. Without a cell of its own it has
	// Partition's claim.
	WriterPartition Fault = "rw-partition"

	// WriterPause is PauseHolder with a write hold, as WriterPartition is
	// Partition.
	WriterPause Fault = "rw-pause"

	// Restart kills a server with SIGKILL and restarts it on the same port
	// and data directory (Redis with appendonly/appendfsync always).
	Restart Fault = "restart"

	// RestartEmpty kills a server with SIGKILL and restarts it with no
	// state (Redis without persistence).
	RestartEmpty Fault = "restart-empty"

	// Stall stops a server with SIGSTOP for longer than the TTL, then
	// resumes it.
	Stall Fault = "stall"

	// KillLeader kills the leader of a consensus cluster (etcd, ZooKeeper)
	// with SIGKILL; healing restarts it.
	KillLeader Fault = "kill-leader"

	// ClockJump has the effect of a forward clock jump on one server: the
	// holder's key expires early there (expired through an admin connection,
	// because libfaketime hangs Debian's redis-server).
	ClockJump Fault = "clock-jump"
)

// Outcome classifies one trial, from best to worst. Outcomes is a set of
// them, for cells whose outcome depends on timing the test does not control.
type Outcome uint8

// Outcomes, best first.
const (
	// Held: the holder kept the lock through the fault; nobody else was
	// granted it meanwhile.
	Held Outcome = 1 << iota

	// LossDetected: the holder lost the lock and was told (its Done closed
	// or its Deadline passed) no later than the next grant of the key. Safe
	// without fencing.
	LossDetected

	// Fenced: two holders overlapped (the next grant came before the old
	// holder's Done closed), and the fencing Guard rejected every stale
	// write. Safe with fencing only.
	Fenced

	// Unsafe: a stale write was accepted, an update was lost, or the next
	// grant's token is not above the holder's. An expected Unsafe cell must
	// reproduce as Unsafe.
	Unsafe
)

// Outcomes is a set of Outcome values.
type Outcomes = Outcome

// String names the outcome(s), joined by "|".
func (o Outcome) String() string {
	var names []string
	for _, x := range []struct {
		o    Outcome
		name string
	}{{Held, "held"}, {LossDetected, "loss-detected"}, {Fenced, "safe-with-fencing"}, {Unsafe, "UNSAFE"}} {
		if o&x.o != 0 {
			names = append(names, x.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// Expect is one cell of the fault matrix: the outcome a driver's deployment
// must show under one fault, and why. A Skip reason instead marks a fault
// the deployment cannot meaningfully take (the trial is skipped with it).
type Expect struct {
	Outcome Outcomes // the allowed outcomes; any other fails the trial
	Why     string   // one line for docs/SAFETY.md: why this is the outcome
	Skip    string   // if set, the cell is skipped with this reason
}

// Matrix is one deployment's row of the fault matrix, stated in the driver's
// test file next to its FaultHarness.
type Matrix map[Fault]Expect

// Link is a breakable network path between one client and every server of a
// deployment: one TCP proxy per server address in a LinkedDSN. A Link that
// also has a Report() string method (testenv's proxies do) is asked what it
// saw when a trial's holder cannot get through it.
type Link interface {
	// Blackhole stops every byte both ways on current and new connections,
	// without closing any; the servers still see the client connected.
	Blackhole(t testing.TB)
	// Cut closes every current connection (both sides see it close) and
	// refuses new ones.
	Cut(t testing.TB)
	// Heal restores normal service on new connections (and, after Blackhole,
	// on the existing ones).
	Heal(t testing.TB)
}

// FaultHarness is an optional interface on a Harness whose deployment can be
// broken. RunFaults uses it; a fault the harness cannot inject is skipped with
// the reason.
type FaultHarness interface {
	Harness

	// Deployment names the deployment for reports, e.g. "redis",
	// "redis-aof", "redlock-5", "etcd-3", "zookeeper-3", "postgres".
	Deployment() string

	// LinkedDSN returns a self-contained DSN (credentials included) that
	// reaches the deployment through a new Link, one proxy per server, and
	// the Link.
	LinkedDSN(t testing.TB) (dsn string, link Link)

	// ServerFaults maps each server fault the deployment can take
	// (Restart, RestartEmpty, Stall, KillLeader, ClockJump) to the function
	// that injects it, so a fault is declared once, with how it is done.
	ServerFaults() map[Fault]Injector
}

// Injector applies one server fault while key is held, and returns once the
// fault is in effect; heal undoes it and returns once the deployment serves
// again.
type Injector func(t testing.TB, key string) (heal func())

// Process is a deployment's one server process, as internal/testenv runs
// them: Kill sends SIGKILL, Restart starts it again on the same data (through
// its crash recovery), Pause and Resume send SIGSTOP and SIGCONT.
type Process interface {
	Kill()
	Restart()
	Pause()
	Resume()
}

// ProcessFaults is ServerFaults for a deployment that is one process p:
// restart (Restart, or RestartEmpty for a server that keeps nothing) kills
// and restarts p, and Stall stops and resumes it.
func ProcessFaults(p Process, restart Fault) map[Fault]Injector {
	return map[Fault]Injector{
		restart: func(testing.TB, string) func() {
			p.Kill()
			return p.Restart
		},
		Stall: func(testing.TB, string) func() {
			p.Pause()
			return p.Resume
		},
	}
}

// serverFaults lists the faults in m in faultOrder.
func serverFaults(m map[Fault]Injector) []Fault {
	var fs []Fault
	for _, f := range faultOrder {
		if m[f] != nil {
			fs = append(fs, f)
		}
	}
	return fs
}
