package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Sizes of BenchmarkFleet; scripts/bench.sh --quick lowers them.
var (
	flagFleetProcs    = flag.Int("dlock.fleet-procs", 16, "Fleet: client processes, each with its own Locker")
	flagFleetLeases   = flag.Int("dlock.fleet-leases", 40, "Fleet: held leases per client process in the steady phase")
	flagFleetTTL      = flag.Duration("dlock.fleet-ttl", 6*time.Second, "Fleet: the held leases' TTL (they renew every TTL/3)")
	flagFleetPhase    = flag.Duration("dlock.fleet-phase", 3*time.Second, "Fleet: how long the contended and uncontended phases and each ramp step run")
	flagFleetSteps    = flag.Int("dlock.fleet-steps", 10, "Fleet: at most this many ramp steps (1, 2, 4, … workers in all)")
	flagFleetBackends = flag.String("dlock.fleet-backends", "", "Fleet: only the backends whose name matches this regexp (all if empty)")
)

// fleetTarget is one backend's servers as the fleet sees them.
type fleetTarget struct {
	name string
	dsn  string
	// pids returns the server processes; their children (PostgreSQL's
	// backends) are counted too.
	pids  func() []int
	reqs  func() (float64, error)
	bytes func() (float64, error) // bytes in + out; nil: the server counts none
	// serialNodes > 0: the servers run each request on one thread (Redis), so
	// serialNodes cores bound them whatever the machine has.
	serialNodes int
	// maxSessions bounds the workers of all processes at once, for backends
	// where each held or waiting lock pins a server session (MySQL).
	maxSessions int
	// maxLeases bounds the held leases of the steady phase over all processes.
	maxLeases int
}

// ---- Child processes -------------------------------------------------------

// fleetChild is one client process: this test binary run as TestFleetChild.
type fleetChild struct {
	id     int
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *bytes.Buffer
	done   chan struct{} // closed when cmd has been waited for
}

// fleet is the client processes of one backend.
type fleet struct {
	tb   testing.TB
	kids []*fleetChild
}

// startFleet starts n child processes on dsn and waits until each has opened
// its Locker; tb's cleanup stops them.
func startFleet(tb testing.TB, dsn string, n int) *fleet {
	tb.Helper()
	f := &fleet{tb: tb}
	tb.Cleanup(f.stop)
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFleetChild$", "-test.count=1", "-test.timeout=30m")
		cmd.Env = append(os.Environ(), fleetChildEnv+"="+dsn, fleetIDEnv+"="+strconv.Itoa(i), "GOMAXPROCS=2")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		c := &fleetChild{id: i, cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
		cmd.Stderr = c.stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			tb.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			tb.Fatalf("fleet: start child %d: %v", i, err)
		}
		c.in = in
		c.out = bufio.NewScanner(out)
		c.out.Buffer(make([]byte, 1<<20), 1<<26)
		f.kids = append(f.kids, c)
	}
	for _, r := range f.replies() {
		if r.Err != "" {
			tb.Fatalf("fleet: a child could not open its Locker: %s", r.Err)
		}
	}
	return f
}

// pids returns the children's process IDs.
func (f *fleet) pids() []int {
	var p []int
	for _, c := range f.kids {
		p = append(p, c.cmd.Process.Pid)
	}
	return p
}

// read returns c's next reply.
func (c *fleetChild) read() (fleetReply, error) {
	for c.out.Scan() {
		line, ok := strings.CutPrefix(c.out.Text(), fleetPrefix)
		if !ok {
			continue
		}
		var r fleetReply
		err := json.Unmarshal([]byte(line), &r)
		return r, err
	}
	err := c.out.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return fleetReply{}, fmt.Errorf("fleet child %d: %w; stderr: %s", c.id, err, tail(c.stderr.String(), 800))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// replies reads one reply of every child, concurrently.
func (f *fleet) replies() []fleetReply {
	rs := make([]fleetReply, len(f.kids))
	errs := make([]error, len(f.kids))
	var wg sync.WaitGroup
	for i, c := range f.kids {
		wg.Go(func() { rs[i], errs[i] = c.read() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.tb.Fatal(err)
	}
	return rs
}

// do sends every child the command cmd(i) and returns their replies.
func (f *fleet) do(cmd func(i int) fleetCmd) []fleetReply {
	for i, c := range f.kids {
		b, err := json.Marshal(cmd(i))
		if err != nil {
			f.tb.Fatal(err)
		}
		if _, err := c.in.Write(append(b, '\n')); err != nil {
			f.tb.Fatalf("fleet child %d: %v; stderr: %s", i, err, tail(c.stderr.String(), 800))
		}
	}
	return f.replies()
}

// stop asks every child to quit and waits for it; a child still there after
// 10s is killed.
func (f *fleet) stop() {
	for _, c := range f.kids {
		_, _ = c.in.Write([]byte(`{"op":"quit"}` + "\n"))
		_ = c.in.Close()
		go func() { _ = c.cmd.Wait(); close(c.done) }()
	}
	for _, c := range f.kids {
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	f.kids = nil
}

// ---- Server-side readings --------------------------------------------------

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// procCPU returns the CPU seconds pid and its reaped children have used
// (utime + stime + cutime + cstime of /proc/PID/stat), and its parent.
func procCPU(pid int) (cpu float64, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: fields start after
	// the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// f[0] is field 3 (state); utime … cstime are fields 14–17.
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ppid, _ = strconv.Atoi(f[1])
	var sum float64
	for _, v := range f[11:15] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += n
	}
	return sum / clockTicks, ppid, nil
}

// treeCPU returns the CPU seconds of roots and of all their live children
// (one level: PostgreSQL's backends), reaped children included through the
// roots' cutime and cstime.
func treeCPU(roots []int) float64 {
	isRoot := map[int]bool{}
	var sum float64
	for _, p := range roots {
		isRoot[p] = true
		if c, _, err := procCPU(p); err == nil {
			sum += c
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return sum
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || isRoot[pid] {
			continue
		}
		if c, ppid, err := procCPU(pid); err == nil && isRoot[ppid] {
			sum += c
		}
	}
	return sum
}

// machineBusy returns the CPU seconds all CPUs have spent busy (not idle,
// not waiting for I/O) since boot, from /proc/stat.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)[1:]
	var busy float64
	for i, v := range f {
		n, _ := strconv.ParseFloat(v, 64)
		// user nice system idle iowait irq softirq steal (guest is in user).
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return busy / clockTicks
}

func loadavg1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// fleetSample is one reading of every counter.
type fleetSample struct {
	at                   time.Time
	server, clients, all float64 // CPU seconds: servers, client processes + this one, whole machine
	reqs, bytes          float64 // -1: not read
}

func (f *fleet) sample(tg fleetTarget) fleetSample {
	s := fleetSample{at: time.Now(), reqs: -1, bytes: -1}
	s.server = treeCPU(tg.pids())
	s.clients = treeCPU(f.pids())
	if own, _, err := procCPU(os.Getpid()); err == nil {
		s.clients += own
	}
	s.all = machineBusy()
	if v, err := tg.reqs(); err == nil {
		s.reqs = v
	} else {
		f.tb.Logf("NOTE fleet %s: request counter: %v", tg.name, err)
	}
	if tg.bytes != nil {
		if v, err := tg.bytes(); err == nil {
			s.bytes = v
		} else {
			f.tb.Logf("NOTE fleet %s: byte counter: %v", tg.name, err)
		}
	}
	return s
}

// fleetCost is what the servers, the clients and the machine spent between
// two samples, per operation.
type fleetCost struct {
	secs                  float64
	server, clients, rest float64 // CPU seconds; rest: other processes on the machine
	reqs, bytes           float64 // -1: not measured
}

func costBetween(a, b fleetSample) fleetCost {
	c := fleetCost{secs: b.at.Sub(a.at).Seconds(), server: b.server - a.server, clients: b.clients - a.clients, reqs: -1, bytes: -1}
	c.rest = max(0, (b.all-a.all)-c.server-c.clients)
	if a.reqs >= 0 && b.reqs >= 0 {
		c.reqs = b.reqs - a.reqs
	}
	if a.bytes >= 0 && b.bytes >= 0 {
		c.bytes = b.bytes - a.bytes
	}
	return c
}

// reportPer reports c per op ops, with suffix naming the operation.
func reportPer(tb testing.TB, c fleetCost, ops float64, suffix string) {
	if ops <= 0 {
		return
	}
	report(tb, c.server/ops*1e6, "server-cpu-µs/"+suffix)
	report(tb, c.clients/ops*1e6, "client-cpu-µs/"+suffix)
	if c.reqs >= 0 {
		report(tb, c.reqs/ops, "reqs/"+suffix)
	}
	if c.bytes >= 0 {
		report(tb, c.bytes/ops, "bytes/"+suffix)
	}
	report(tb, c.server/c.secs, "server-cores")
	report(tb, c.rest/c.secs, "other-cores")
	report(tb, loadavg1(), "load1")
}

// ---- The benchmark ---------------------------------------------------------

// BenchmarkFleet drives each backend from many client processes at once (run
// it with -benchtime 1x; sizes come from the -dlock.fleet-* flags). Each
// backend gets -dlock.fleet-procs child processes (this binary re-run as
// TestFleetChild), each with its own Locker, and these phases:
//
//   - idle: the clients connected, doing nothing: the servers' own cost,
//     which the costs per operation below leave out.
//   - steady: every process holds -dlock.fleet-leases leases of TTL
//     -dlock.fleet-ttl (taken one by one over TTL/3, so that their renewals
//     spread out), renewed by dlock every TTL/3; over one TTL: renewals/s
//     (counted by the clients' observers) and the cost per renewal.
//   - contended: two workers per process wait for one of procs/4 keys and hold
//     each grant 1ms, for -dlock.fleet-phase: grants/s, hand-off p50/p99
//     (release → another holder's grant, across processes) and the cost per
//     hand-off (waiters' work included); an overlap of two holders fails it.
//   - uncontended: one worker per process takes and releases a key of its own,
//     holding it 1ms: grants/s, cycle p50/p99, cost per grant.
//   - ramp/w=N: N workers in all (spread over the processes) with no hold,
//     N = 1, 2, 4, … until grants/s rises by less than 10% (after at least
//     three steps) or -dlock.fleet-steps steps ran.
//   - model: the saturation that the CPU costs per grant of the ramp step
//     below the best one predict (docs/CAPACITY.md), the best step's measured
//     grants/s, and the error.
//
// Costs are CPU-µs of the server processes (/proc/PID/stat, children
// included) and of the clients, server requests and bytes (each server's own
// counters) per operation; server-cores and other-cores are the CPU the
// servers' operations and the machine's other processes used; load1 is the
// load average when the phase ended.
func BenchmarkFleet(b *testing.B) {
	var only *regexp.Regexp
	if *flagFleetBackends != "" {
		only = regexp.MustCompile(*flagFleetBackends)
	}
	for _, be := range fleetBackends {
		if only != nil && !only.MatchString(be.name) {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			tg := be.start(b)
			runFleet(b, tg, fleetSizes{
				procs: *flagFleetProcs, leases: *flagFleetLeases, ttl: *flagFleetTTL,
				phase: *flagFleetPhase, steps: *flagFleetSteps,
			})
		})
	}
}

type fleetSizes struct {
	procs, leases int
	ttl, phase    time.Duration
	steps         int
}

// fleetResult is what one fleet run measured, for the model and TestSmoke.
type fleetResult struct {
	renewals, handoffs, grants int
	overlaps                   int
	errors                     int
	idle                       fleetCost
	predicted, measured        float64 // saturation grants/s
}

// fleetRun is b.Run for a benchmark and t.Run for a test (TestSmoke).
func fleetRun(tb testing.TB, name string, f func(tb testing.TB)) {
	switch x := tb.(type) {
	case *testing.B:
		x.Run(name, func(b *testing.B) { f(b) })
	case *testing.T:
		x.Run(name, func(t *testing.T) { f(t) })
	default:
		tb.Fatalf("fleet: %T", tb)
	}
}

// runFleet runs BenchmarkFleet's phases on the servers tg with sizes sz.
func runFleet(b testing.TB, tg fleetTarget, sz fleetSizes) fleetResult {
	var res fleetResult
	f := startFleet(b, tg.dsn, sz.procs)
	workers := func(w int) int {
		if tg.maxSessions > 0 {
			w = min(w, max(1, tg.maxSessions/sz.procs))
		}
		return w
	}

	// The servers' own cost with the clients connected and idle (sessions,
	// heartbeats, a cluster's internal traffic): the costs per operation
	// below are what the operations add to it.
	fleetRun(b, "idle", func(b testing.TB) {
		s0 := f.sample(tg)
		time.Sleep(sz.phase)
		s1 := f.sample(tg)
		res.idle = costBetween(s0, s1)
		c := res.idle
		report(b, c.server/c.secs, "server-cores")
		if c.reqs >= 0 {
			report(b, c.reqs/c.secs, "reqs/s")
		}
		report(b, c.rest/c.secs, "other-cores")
		report(b, loadavg1(), "load1")
	})
	idleRate := 0.0
	if res.idle.secs > 0 {
		idleRate = res.idle.server / res.idle.secs
	}
	// marginal is c without the servers' idle cost over its span.
	marginal := func(c fleetCost) fleetCost {
		c.server = max(0, c.server-idleRate*c.secs)
		return c
	}

	fleetRun(b, "steady", func(b testing.TB) {
		per := sz.leases
		if tg.maxLeases > 0 {
			per = min(per, max(1, tg.maxLeases/sz.procs))
		}
		for _, r := range f.do(func(int) fleetCmd { return fleetCmd{Op: "hold", N: per, TTL: sz.ttl} }) {
			if r.Err != "" {
				b.Fatalf("fleet %s: hold: %s", tg.name, r.Err)
			}
		}
		// Until every lease has renewed once.
		time.Sleep(sz.ttl / 3)
		sum := func(rs []fleetReply) (n int64) {
			for _, r := range rs {
				n += r.Renewals
			}
			return n
		}
		s0 := f.sample(tg)
		n0 := sum(f.do(func(int) fleetCmd { return fleetCmd{Op: "mark"} }))
		time.Sleep(sz.ttl)
		n1 := sum(f.do(func(int) fleetCmd { return fleetCmd{Op: "mark"} }))
		s1 := f.sample(tg)
		lost := 0
		for _, r := range f.do(func(int) fleetCmd { return fleetCmd{Op: "release"} }) {
			if r.Lost > 0 {
				lost += r.Lost
				b.Logf("NOTE fleet %s: %d leases lost while held: %s", tg.name, r.Lost, r.FirstErr)
			}
		}
		c := marginal(costBetween(s0, s1))
		res.renewals = int(n1 - n0)
		report(b, float64(per*sz.procs), "leases")
		report(b, float64(n1-n0)/c.secs, "renewals/s")
		report(b, float64(per*sz.procs)/(sz.ttl/3).Seconds(), "expected-renewals/s")
		reportPer(b, c, float64(n1-n0), "renewal")
		report(b, float64(lost), "lost")
	})

	fleetRun(b, "contended", func(b testing.TB) {
		nkeys := max(1, sz.procs/4)
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = uniqueKey("fleet", tg.name, "contended", strconv.Itoa(i))
		}
		w := workers(2)
		s0 := f.sample(tg)
		rs := f.do(func(int) fleetCmd {
			return fleetCmd{Op: "contend", N: w, Keys: keys, Hold: time.Millisecond, For: sz.phase}
		})
		s1 := f.sample(tg)
		var grants []fleetGrant
		errs := 0
		for _, r := range rs {
			grants = append(grants, r.Grants...)
			errs += r.Errors
			if r.FirstErr != "" {
				b.Logf("NOTE fleet %s contended: %s", tg.name, r.FirstErr)
			}
		}
		handoffs, overlaps := fleetHandoffs(grants)
		c := marginal(costBetween(s0, s1))
		res.handoffs, res.overlaps, res.errors = len(handoffs), overlaps, res.errors+errs
		report(b, float64(nkeys), "keys")
		report(b, float64(w*sz.procs), "waiters")
		report(b, float64(len(grants))/c.secs, "grants/s")
		report(b, float64(len(handoffs))/c.secs, "handoffs/s")
		if len(handoffs) > 0 {
			report(b, float64(pct(handoffs, 50).Nanoseconds()), "handoff-p50-ns")
			report(b, float64(pct(handoffs, 99).Nanoseconds()), "handoff-p99-ns")
		}
		reportPer(b, c, float64(len(handoffs)), "handoff")
		report(b, float64(overlaps), "overlaps")
		report(b, float64(errs), "errors")
		if overlaps > 0 {
			b.Errorf("fleet %s: %d grants overlapped another holder", tg.name, overlaps)
		}
	})

	// cycle runs one uncontended phase of total workers spread over the
	// processes (the first total mod procs get one more).
	type cycleResult struct {
		total    int
		rate     float64
		p50, p99 time.Duration
		cost     fleetCost
		grants   int
	}
	cycle := func(b testing.TB, total int, hold time.Duration) cycleResult {
		s0 := f.sample(tg)
		rs := f.do(func(i int) fleetCmd {
			n := total / sz.procs
			if i < total%sz.procs {
				n++
			}
			return fleetCmd{Op: "cycle", N: n, Hold: hold, For: sz.phase}
		})
		s1 := f.sample(tg)
		var lat []time.Duration
		n, errs := 0, 0
		for _, r := range rs {
			n += r.Cycles
			errs += r.Errors
			for _, v := range r.Lat {
				lat = append(lat, time.Duration(v))
			}
			if r.FirstErr != "" {
				b.Logf("NOTE fleet %s uncontended: %s", tg.name, r.FirstErr)
			}
		}
		res.errors += errs
		c := marginal(costBetween(s0, s1))
		cr := cycleResult{total: total, rate: float64(n) / c.secs, p50: pct(lat, 50), p99: pct(lat, 99), cost: c, grants: n}
		report(b, float64(total), "workers")
		report(b, cr.rate, "grants/s")
		report(b, float64(cr.p50.Nanoseconds()), "p50-ns")
		report(b, float64(cr.p99.Nanoseconds()), "p99-ns")
		reportPer(b, c, float64(n), "grant")
		report(b, float64(errs), "errors")
		return cr
	}

	var light cycleResult
	fleetRun(b, "uncontended", func(b testing.TB) {
		light = cycle(b, sz.procs, time.Millisecond)
		res.grants = light.grants
	})

	// The ramp: 1, 2, 4, … workers in all, until grants/s rises by less than
	// 10% over the best so far.
	var steps []cycleResult
	best := -1
	for total := 1; len(steps) < sz.steps; total *= 2 {
		if tg.maxSessions > 0 && total > tg.maxSessions {
			b.Logf("NOTE fleet %s: ramp stopped at %d workers: each pins a server session", tg.name, total/2)
			break
		}
		var r cycleResult
		fleetRun(b, "ramp/w="+strconv.Itoa(total), func(b testing.TB) { r = cycle(b, total, 0) })
		steps = append(steps, r)
		if best < 0 || r.rate > steps[best].rate {
			prev := 0.0
			if best >= 0 {
				prev = steps[best].rate
			}
			best = len(steps) - 1
			if r.rate >= prev*1.1 {
				continue
			}
		}
		if len(steps) >= 3 {
			break
		}
	}
	if best < 0 {
		b.Fatalf("fleet %s: no ramp step ran", tg.name)
	}
	sat := steps[best]
	// The model's costs: the ramp step at half the saturating concurrency,
	// measured below saturation (the first step when that is the best).
	below := steps[max(0, best-1)]

	fleetRun(b, "model", func(b testing.TB) {
		m := fleetModel(tg, below.cost, float64(below.grants), sat.cost, idleRate)
		ml := fleetModel(tg, light.cost, float64(light.grants), sat.cost, idleRate)
		res.predicted, res.measured = m.predicted, sat.rate
		report(b, float64(below.total), "model-workers")
		report(b, below.cost.server/float64(max(1, below.grants))*1e6, "server-cpu-µs/grant")
		report(b, below.cost.clients/float64(max(1, below.grants))*1e6, "client-cpu-µs/grant")
		report(b, m.perCore, "grants/s-per-server-core")
		report(b, m.cpuBound, "cpu-bound-grants/s")
		if m.serialBound > 0 {
			report(b, m.serialBound, "serial-bound-grants/s")
		}
		report(b, m.avail, "cores-available")
		report(b, m.predicted, "predicted-grants/s")
		report(b, ml.predicted, "predicted-light-grants/s")
		report(b, float64(sat.total), "saturation-workers")
		report(b, sat.rate, "measured-grants/s")
		if sat.rate > 0 {
			report(b, 100*(m.predicted-sat.rate)/sat.rate, "error-%")
		}
		report(b, sat.cost.server/sat.cost.secs+idleRate, "server-cores-at-saturation")
		report(b, (sat.cost.server+sat.cost.clients+sat.cost.rest)/sat.cost.secs+idleRate, "machine-cores-at-saturation")
		report(b, loadavg1(), "load1")
	})
	return res
}

// fleetModelResult is the capacity model's prediction for one backend on
// this machine (docs/CAPACITY.md).
type fleetModelResult struct {
	perCore     float64 // grants/s one server core sustains: 1 / server CPU-s per grant
	serialBound float64 // serialNodes / server CPU-s per grant, or 0
	cpuBound    float64 // avail / (server + client CPU-s per grant)
	avail       float64 // cores left for the operations: nproc − other processes' use at saturation − the servers' idle use
	predicted   float64
}

// fleetModel predicts the saturation grants/s from the per-grant CPU costs
// measured below saturation (base, over n grants, the servers' idle cost
// taken out): the servers and the clients share the cores that the machine's
// other processes (measured over the saturated step, sat) and the servers'
// idle work (idle cores) leave, and single-threaded servers stop at one core
// each.
func fleetModel(tg fleetTarget, base fleetCost, n float64, sat fleetCost, idle float64) fleetModelResult {
	var m fleetModelResult
	if n <= 0 || base.server <= 0 {
		return m
	}
	cs, cc := base.server/n, base.clients/n
	m.perCore = 1 / cs
	m.avail = float64(runtime.NumCPU())
	if sat.secs > 0 {
		m.avail -= sat.rest / sat.secs
	}
	m.avail = max(0.1, m.avail-idle)
	m.cpuBound = m.avail / (cs + cc)
	m.predicted = m.cpuBound
	if tg.serialNodes > 0 {
		m.serialBound = (float64(tg.serialNodes) - idle) / cs
		m.predicted = min(m.predicted, m.serialBound)
	}
	return m
}

// fleetHandoffs returns, from the grants of the contended keys, the time from
// each release to the next grant of that key to another holder, and how many
// grants came before the previous holder began its release (an overlap).
func fleetHandoffs(grants []fleetGrant) (handoffs []time.Duration, overlaps int) {
	byKey := map[int][]fleetGrant{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	for _, gs := range byKey {
		slices.SortFunc(gs, func(a, b fleetGrant) int { return cmp.Compare(a.Got, b.Got) })
		for i := 1; i < len(gs); i++ {
			prev, g := gs[i-1], gs[i]
			if g.Got < prev.Rel {
				overlaps++
				continue
			}
			if g.Holder != prev.Holder {
				handoffs = append(handoffs, time.Duration(g.Got-prev.Rel))
			}
		}
	}
	return handoffs, overlaps
}

// fleetSmoke runs the fleet's phases on Redis at tiny sizes (TestSmoke) and
// checks that every phase measured something and no two holders overlapped.
func fleetSmoke(t *testing.T) {
	be := fleetBackends[0]
	r := runFleet(t, be.start(t), fleetSizes{procs: 2, leases: 3, ttl: 750 * time.Millisecond, phase: 200 * time.Millisecond, steps: 3})
	// The prediction may be 0 at these sizes (a step's server CPU can round
	// to no clock tick), but never negative or NaN.
	if r.renewals <= 0 || r.handoffs <= 0 || r.grants <= 0 || r.overlaps != 0 || r.errors != 0 || r.measured <= 0 || !(r.predicted >= 0) {
		t.Errorf("fleet %s: %d renewals, %d hand-offs, %d grants, %d overlaps, %d errors, saturation %.0f/s measured, %.0f/s predicted",
			be.name, r.renewals, r.handoffs, r.grants, r.overlaps, r.errors, r.measured, r.predicted)
	}
}
