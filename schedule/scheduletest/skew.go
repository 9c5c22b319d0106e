package scheduletest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
	"github.com/dlock-go/dlock/schedule/internal/hook"
)

// The skew tests run several processes of one schedule, each with its clock
// skewed (±2 s), and read what each ran from its output. libfaketime does not
// shift a Go program's clock (Go reads the time through the vDSO, not libc:
// docs/schedule.md), so each process skews its own clock, the one Every
// reads, as the environment variable childSkew says.
const (
	childDSN    = "SCHEDULE_CHILD_DSN"
	childSkew   = "SCHEDULE_CHILD_SKEW"
	childNode   = "SCHEDULE_CHILD_NODE"
	childPeriod = "SCHEDULE_CHILD_PERIOD"
	childMode   = "SCHEDULE_CHILD_MODE"
	childWork   = "SCHEDULE_CHILD_WORK"
	childEnd    = "SCHEDULE_CHILD_END"
	childBreak  = "SCHEDULE_CHILD_BREAK"
	childJob    = "SCHEDULE_CHILD_JOB"
	childLeast  = "SCHEDULE_CHILD_AT_LEAST"
	childMost   = "SCHEDULE_CHILD_AT_MOST"
)

// Child is a node of a skew test when the test binary runs as its child;
// otherwise it skips. Call it from a test named TestSkewChild in the package
// that calls TestSkewed (the skew tests run their binary again with
// -test.run=^TestSkewChild$). It runs Every until the time the parent set,
// printing a START line when a run starts and an END line when it ends.
func Child(t *testing.T) {
	dsn := os.Getenv(childDSN)
	if dsn == "" {
		t.Skip("a child of the skew tests")
	}
	skew, _ := time.ParseDuration(os.Getenv(childSkew))
	period, _ := time.ParseDuration(os.Getenv(childPeriod))
	work, _ := time.ParseDuration(os.Getenv(childWork))
	endNanos, _ := strconv.ParseInt(os.Getenv(childEnd), 10, 64)
	mode, _ := strconv.Atoi(os.Getenv(childMode))
	node := os.Getenv(childNode)
	hook.BreakRecordCheck = os.Getenv(childBreak) == "1"
	l := open(t, dsn)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, endNanos))
	defer cancel()
	ctx = context.WithValue(ctx, hook.ClockKey{}, func() time.Time { return time.Now().Add(skew) })
	atLeast, _ := time.ParseDuration(os.Getenv(childLeast))
	atMost, _ := time.ParseDuration(os.Getenv(childMost))
	job := schedule.Job{Name: os.Getenv(childJob), AtMost: atMost, RetryWithin: 2 * atMost, AtLeast: atLeast, Mode: schedule.Mode(mode), Retention: time.Minute}
	fmt.Printf("READY %s\n", node)
	_ = schedule.Every(ctx, l, job, period, func(fctx context.Context, lease *dlock.Lease) error {
		at, _ := schedule.ScheduledAt(fctx)
		fmt.Printf("START %d %s %d\n", at.UnixNano(), node, lease.Token())
		select {
		case <-time.After(work):
		case <-fctx.Done():
			return context.Cause(fctx)
		}
		fmt.Printf("END %d %s %d\n", at.UnixNano(), node, lease.Token())
		return nil
	}, func(at time.Time, r schedule.Result, err error) {
		if err != nil || r.Status == schedule.InProgress || r.Status == schedule.Redo {
			fmt.Fprintf(os.Stderr, "%s: the run at %s: %v (holder %q) %v\n", node, at.UTC().Format("15:04:05.000"), r.Status, r.Holder, err)
		}
	})
}

// skewConfig is one skew test: its nodes' skews, the period, each run's work,
// how long the nodes run, and which node to kill (SIGKILL) a third of the way,
// when it has just printed killOn ("START": mid-run, "END": between runs).
type skewConfig struct {
	job    string        // the job's name: one per test, so that tests can run at once
	least  time.Duration // the job's AtLeast
	most   time.Duration // the job's AtMost (RetryWithin is twice that)
	dsn    string
	skews  []time.Duration
	period time.Duration
	work   time.Duration
	run    time.Duration
	mode   schedule.Mode
	broken bool
	victim int // index in skews; -1: none
	killOn string
}

// event is a line of a node's output.
type event struct {
	kind  string // START or END
	at    int64  // the run's scheduled time, Unix ns
	node  string
	token uint64
	when  time.Time // when the parent read it
}

// String shows the event as "n2(2s) token 17".
func (e event) String() string { return fmt.Sprintf("%s token %d", e.node, e.token) }

// skewResult is what a skew test's nodes printed, and the span of real time
// in which every run must have been made.
type skewResult struct {
	events     []event
	from, to   time.Time // scheduled times in [from, to] must have run
	killedAt   time.Time
	victimNode string
}

// runSkewed runs the nodes of cfg as child processes and collects their output.
func runSkewed(t *testing.T, cfg skewConfig) skewResult {
	t.Helper()
	var maxSkew time.Duration
	for _, s := range cfg.skews {
		maxSkew = max(maxSkew, s, -s)
	}
	startup := 5 * time.Second // the children start and connect within it
	end := time.Now().Add(startup + cfg.run)
	// The nodes run on past end, so that a run due before end that waits
	// for a dead node's lease to expire (up to AtMost, RetryWithin twice
	// that) still has live nodes to make it, however slow the machine.
	drain := 2*cfg.most + 3*time.Second
	mode := strconv.Itoa(int(cfg.mode))
	broken := "0"
	if cfg.broken {
		broken = "1"
	}
	lines := make(chan event, 1024)
	ready := make(chan string, len(cfg.skews))
	var wg sync.WaitGroup
	procs := make([]*exec.Cmd, len(cfg.skews))
	for i, skew := range cfg.skews {
		node := fmt.Sprintf("n%d(%+v)", i, skew)
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkewChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			childDSN+"="+cfg.dsn, childSkew+"="+skew.String(), childNode+"="+node,
			childPeriod+"="+cfg.period.String(), childWork+"="+cfg.work.String(),
			childMode+"="+mode, childEnd+"="+strconv.FormatInt(end.Add(drain).UnixNano(), 10), childBreak+"="+broken, childJob+"="+cfg.job, childLeast+"="+cfg.least.String(), childMost+"="+cfg.most.String())
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		wg.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 2 && f[0] == "READY":
					ready <- f[1]
				case len(f) == 4 && (f[0] == "START" || f[0] == "END"):
					at, _ := strconv.ParseInt(f[1], 10, 64)
					tok, _ := strconv.ParseUint(f[3], 10, 64)
					lines <- event{f[0], at, f[2], tok, time.Now()}
				}
			}
			_ = cmd.Wait()
		})
	}
	go func() { wg.Wait(); close(lines) }()
	for range cfg.skews {
		select {
		case <-ready:
		case <-time.After(startup):
			t.Fatal("the nodes did not start in time")
		}
	}
	res := skewResult{from: time.Now().Add(maxSkew + cfg.period), to: end.Add(-maxSkew - 2*cfg.period)}
	killAfter := time.Now().Add(time.Until(end) / 3)
	if cfg.victim >= 0 {
		res.victimNode = fmt.Sprintf("n%d(%+v)", cfg.victim, cfg.skews[cfg.victim])
	}
	for ev := range lines {
		res.events = append(res.events, ev)
		if res.killedAt.IsZero() && cfg.victim >= 0 && ev.node == res.victimNode && ev.kind == cfg.killOn && ev.when.After(killAfter) {
			_ = procs[cfg.victim].Process.Signal(syscall.SIGKILL)
			res.killedAt = time.Now()
			t.Logf("killed %s after its %s line of the run at %v", ev.node, ev.kind, time.Unix(0, ev.at).UTC().Format("15:04:05.000"))
		}
	}
	return res
}

// byRun groups events by the run's scheduled time and kind.
func byRun(evs []event, kind string) map[int64][]event {
	m := map[int64][]event{}
	for _, ev := range evs {
		if ev.kind == kind {
			m[ev.at] = append(m[ev.at], ev)
		}
	}
	return m
}

// periods lists the scheduled times in [from, to].
func periods(from, to time.Time, period time.Duration) []int64 {
	var ps []int64
	for at := from.Truncate(period).Add(period); !at.After(to); at = at.Add(period) {
		ps = append(ps, at.UnixNano())
	}
	return ps
}

// skewRunTime is how long the nodes of a skew test run: DLOCK_SOAK makes it
// a minute.
func skewRunTime() time.Duration {
	if os.Getenv("DLOCK_SOAK") != "" {
		return time.Minute
	}
	return 10 * time.Second
}

var skews = []time.Duration{-2 * time.Second, 0, 2 * time.Second}

// testSkewedProcesses: three processes of one schedule, their clocks 2 s
// behind, right and 2 s ahead, a run every 250 ms: every run is started
// exactly once, none is skipped, also after the node that runs them all
// (the one ahead) is killed between two runs.
func testSkewedProcesses(t *testing.T, dsn string, atLeast, atMost time.Duration) {
	const period = 250 * time.Millisecond
	res := runSkewed(t, skewConfig{job: "skewed", least: atLeast, most: atMost, dsn: dsn, skews: skews, period: period, work: 20 * time.Millisecond,
		run: skewRunTime(), mode: schedule.NotRepeated, victim: 2, killOn: "END"})
	starts, ends := byRun(res.events, "START"), byRun(res.events, "END")
	for at, evs := range starts {
		if len(evs) > 1 {
			t.Errorf("the run at %v started %d times: %v", time.Unix(0, at).UTC().Format("15:04:05.000"), len(evs), evs)
		}
	}
	want := periods(res.from, res.to, period)
	for _, at := range want {
		if len(starts[at]) != 1 || len(ends[at]) != 1 {
			t.Errorf("the run at %v: %d starts, %d ends; want 1 each (no run skipped while a node was alive)",
				time.Unix(0, at).UTC().Format("15:04:05.000"), len(starts[at]), len(ends[at]))
		}
	}
	// Runs after the kill count up to the end of the nodes' output, past the
	// checked span: a victim that fell behind is killed late in it.
	afterKill := 0
	for at, evs := range starts {
		if time.Unix(0, at).After(res.killedAt.Add(3*time.Second)) && len(evs) == 1 && evs[0].node != res.victimNode {
			afterKill++
		}
	}
	if res.killedAt.IsZero() || afterKill == 0 {
		t.Errorf("the victim was not killed (%v) or no run was made by the others after (%d)", res.killedAt, afterKill)
	}
	t.Logf("%d runs checked, %d of them by the survivors after the kill", len(want), afterKill)
}

// testSkewedProcessesRetryLost: in Mode RetryLost, a node killed mid-run
// (after its START line) leaves the run unrecorded, and a node whose clock
// is behind makes the run again once the dead node's lease is lost; every
// other run is started once.
func testSkewedProcessesRetryLost(t *testing.T, dsn string, atLeast, atMost time.Duration) {
	const period = 250 * time.Millisecond
	res := runSkewed(t, skewConfig{job: "skewed-retry", least: atLeast, most: atMost, dsn: dsn, skews: skews, period: period, work: 100 * time.Millisecond,
		run: skewRunTime(), mode: schedule.RetryLost, victim: 2, killOn: "START"})
	starts, ends := byRun(res.events, "START"), byRun(res.events, "END")
	retried := 0
	for _, at := range periods(res.from, res.to, period) {
		s, e := starts[at], ends[at]
		switch {
		case len(e) != 1:
			t.Errorf("the run at %v completed %d times, want 1: %v", time.Unix(0, at).UTC().Format("15:04:05.000"), len(e), s)
		case len(s) == 2 && s[0].node == res.victimNode && e[0].node != res.victimNode:
			retried++
		case len(s) != 1:
			t.Errorf("the run at %v started %d times: %v", time.Unix(0, at).UTC().Format("15:04:05.000"), len(s), s)
		}
	}
	if retried != 1 {
		t.Errorf("%d runs were retried after the kill, want 1", retried)
	}
}

// testSkewedProcessesCatchDoubleRun: the skew test fails when the record
// check is broken on purpose: the node whose clock is behind runs again the
// runs the one ahead has finished.
func testSkewedProcessesCatchDoubleRun(t *testing.T, dsn string, atLeast, atMost time.Duration) {
	const period = 250 * time.Millisecond
	res := runSkewed(t, skewConfig{job: "skewed-broken", least: atLeast, most: atMost, dsn: dsn, skews: skews, period: period, work: 20 * time.Millisecond,
		run: 3 * time.Second, mode: schedule.NotRepeated, broken: true, victim: -1})
	twice := 0
	var example []event
	for _, evs := range byRun(res.events, "START") {
		if len(evs) > 1 {
			twice++
			example = evs
		}
	}
	if twice == 0 {
		t.Fatal("with the record check broken, no run started twice: the skew test could not catch it")
	}
	t.Logf("with the record check broken, %d runs started more than once, e.g. %v", twice, example)
}

// TestSkewed runs the skew tests on the backend of dsn, with a run every
// 250 ms of a job whose AtLeast and AtMost are atLeast and atMost (50 ms and
// 1 s, say; 0 and 2 s on a backend such as etcd whose TTLs are whole
// seconds, 2 at least): three processes of
// one schedule whose clocks are 2 s behind, right and 2 s ahead (Processes:
// every run made once; RetryLost: a run whose node was killed mid-run made
// again), and the proof that they catch a run made twice (CatchDoubleRun:
// the record check broken on purpose). The caller's package needs a
// TestSkewChild that calls Child. DLOCK_SOAK makes the runs a minute long.
//
// The subtests run in parallel, each with a job of its own: their processes
// mostly sleep.
func TestSkewed(t *testing.T, dsn string, atLeast, atMost time.Duration) {
	t.Run("Processes", func(t *testing.T) { t.Parallel(); testSkewedProcesses(t, dsn, atLeast, atMost) })
	t.Run("RetryLost", func(t *testing.T) { t.Parallel(); testSkewedProcessesRetryLost(t, dsn, atLeast, atMost) })
	t.Run("CatchDoubleRun", func(t *testing.T) { t.Parallel(); testSkewedProcessesCatchDoubleRun(t, dsn, atLeast, atMost) })
}
