// Command benchreport turns the output of the bench module's benchmarks
// (go test -bench, any -count) into docs/BENCHMARKS.md: one table per
// scenario with the median over the runs, and the targets as ratios,
// each computed from measurements of the same run. scripts/bench.sh runs it:
//
//	go run ./cmd/benchreport -in raw.txt -meta meta.txt -cmd 'scripts/bench.sh' -out ../docs/BENCHMARKS.md
//
// meta.txt holds "key<TAB>value" lines (date, machine, server versions),
// printed in order under "Machine".
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	in := flag.String("in", "", "raw go test -bench output (required)")
	meta := flag.String("meta", "", "key<TAB>value lines describing the run")
	cmd := flag.String("cmd", "scripts/bench.sh", "the command that produced the run")
	out := flag.String("out", "", "markdown file to write (default: stdout)")
	flag.Parse()
	if *in == "" {
		fmt.Fprintln(os.Stderr, "benchreport: -in is required")
		os.Exit(2)
	}
	if err := run(*in, *meta, *cmd, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(in, meta, cmd, out string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	res, err := parse(strings.NewReader(string(raw)))
	if err != nil {
		return err
	}
	if len(res.order) == 0 {
		return fmt.Errorf("%s: no benchmark results", in)
	}
	var kv [][2]string
	if meta != "" {
		b, err := os.ReadFile(meta)
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(b)) {
			k, v, ok := strings.Cut(strings.TrimRight(line, "\n"), "\t")
			if ok {
				kv = append(kv, [2]string{k, v})
			}
		}
	}
	var w strings.Builder
	write(&w, res, kv, cmd, string(raw))
	if out == "" {
		_, err := io.WriteString(os.Stdout, w.String())
		return err
	}
	return os.WriteFile(out, []byte(w.String()), 0o644)
}

// results maps a benchmark name (without the -GOMAXPROCS suffix) and a unit
// to the values of every run, in run order.
type results struct {
	order []string
	vals  map[string]map[string][]float64
}

var lineRE = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

func parse(r io.Reader) (*results, error) {
	res := &results{vals: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name := strings.TrimPrefix(m[1], "Benchmark")
		f := strings.Fields(m[2])
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("odd value/unit pairs in %q", sc.Text())
		}
		if res.vals[name] == nil {
			res.vals[name] = map[string][]float64{}
			res.order = append(res.order, name)
		}
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bad value %q in %q", f[i], sc.Text())
			}
			res.vals[name][f[i+1]] = append(res.vals[name][f[i+1]], v)
		}
	}
	return res, sc.Err()
}

// get returns the median of name's unit over the runs, and whether there is
// one.
func (r *results) get(name, unit string) (float64, bool) {
	v := r.vals[name][unit]
	if len(v) == 0 {
		return 0, false
	}
	return median(v), true
}

// ratio returns the median over the runs of a/b, each run's a divided by the
// same run's b (the values are in run order).
func (r *results) ratio(na, ua, nb, ub string) (float64, bool) {
	a, b := r.vals[na][ua], r.vals[nb][ub]
	n := min(len(a), len(b))
	if n == 0 {
		return 0, false
	}
	q := make([]float64, 0, n)
	for i := range n {
		if b[i] != 0 {
			q = append(q, a[i]/b[i])
		}
	}
	if len(q) == 0 {
		return 0, false
	}
	return median(q), true
}

// ratioRange returns the smallest and largest per-run a/b.
func (r *results) ratioRange(na, ua, nb, ub string) (lo, hi float64, n int) {
	a, b := r.vals[na][ua], r.vals[nb][ub]
	lo, hi = math.Inf(1), math.Inf(-1)
	for i := range min(len(a), len(b)) {
		if b[i] != 0 {
			q := a[i] / b[i]
			lo, hi, n = math.Min(lo, q), math.Max(hi, q), n+1
		}
	}
	return lo, hi, n
}

// diffMicros is the median over the runs of name's unit a less its unit b
// (both in ns, in run order), in µs.
func (r *results) diffMicros(name, a, b string) (float64, bool) {
	va, vb := r.vals[name][a], r.vals[name][b]
	var d []float64
	for i := range min(len(va), len(vb)) {
		d = append(d, (va[i]-vb[i])/1e3)
	}
	if len(d) == 0 {
		return 0, false
	}
	return median(d), true
}

// addedMicros is the median over the runs of what implementation a adds to
// a cycle over b, in µs, from their ops/s in run order.
func (r *results) addedMicros(name, a, b string) (float64, bool) {
	va, vb := r.vals[name][a], r.vals[name][b]
	var d []float64
	for i := range min(len(va), len(vb)) {
		if va[i] != 0 && vb[i] != 0 {
			d = append(d, 1e6/va[i]-1e6/vb[i])
		}
	}
	if len(d) == 0 {
		return 0, false
	}
	return median(d), true
}

func (r *results) runs(name string) int {
	n := 0
	for _, v := range r.vals[name] {
		n = max(n, len(v))
	}
	return n
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// backend describes how one backend's benchmarks are named.
type backend struct {
	title string // "Redis"
	bench string // "Redis": BenchmarkRedis
	scale string // "redis": BenchmarkScale/*/redis
	peers []string
	floor string
	note  string // what the floor and peers are
}

var backends = []backend{
	{"Redis", "Redis", "redis", []string{"redsync", "redislock"}, "floor",
		"One redis-server for dlock, dlock in fair mode (`dlock-fair`, `?fair=true`), redsync (1 pool), redislock and the floor (SET NX PX + owner-checked DEL script), which cannot wait; the fenced floor (`fenced-floor`: dlock's own acquire script with the lock's and the fence's keys only, which takes the lock with SET NX PX and draws dlock's token, the key's counter plus one floored at the server's clock in µs; then the floor's release; no shared holders looked at, nothing announced, no lease), which cannot wait either; in the rotation and the scale scenarios (not in the uncontended and contended ones), `handoff-floor`, the least a direct hand-off takes (a refused waiter queues its id in the same script and waits for a message on a channel of its own; the release script makes the head the holder and publishes once; no token, no TTL of waiters, not a lock to use); five more for dlock's Redlock (`dlock-redlock5`) and redsync with 5 pools (`redsync5`). redsync waits by polling (random 50–250ms, its default); redislock by a 10ms linear backoff (it has no default). Server requests: `INFO stats total_commands_processed`, which counts a script call and each command the script runs."},
	{"etcd", "Etcd", "etcd", []string{"etcd-mutex"}, "floor",
		"One etcd server. `etcd-mutex` is `concurrency.Mutex` with one session (lease TTL 10s) per client; the floor is a txn put-if-absent attached to a lease granted once per client, then a delete. Server requests: `grpc_server_msg_received_total` from `/metrics` (unary calls and stream messages)."},
	{"ZooKeeper", "ZooKeeper", "zookeeper", []string{"zk-lock"}, "floor",
		"One standalone ZooKeeper. `zk-lock` is go-zookeeper's `zk.NewLock` (no try-lock: the uncontended run uses `Lock`); the floor creates an ephemeral node and deletes it. Server requests: `zk_packets_received` from `mntr` (includes session pings)."},
	{"PostgreSQL", "Postgres", "postgres", []string{"pg-advisory"}, "floor",
		"One PostgreSQL server, fsync on. `dlock-seq` is dlock with `tokens=sequence` (its own table); counter mode stays the default: see [docs/postgres.md](postgres.md#why-counter-mode-stays-the-default). `pg-advisory` is `pg_advisory_lock` / `pg_advisory_unlock` on one pgx connection per client; the floor is `pg_try_advisory_lock` / `pg_advisory_unlock`. Server requests: statements, from `pg_stat_statements`."},
	{"MySQL (MariaDB)", "MySQL", "mysql", []string{"get-lock", "get-lock-1s", "shedlock"}, "floor",
		"One MariaDB server, innodb_flush_log_at_trx_commit=1 (a log flush per commit). `dlock` is `mysql://` (GET_LOCK on a pinned session, the token a committed counter); `dlock-table` is the table lock `mysqltable://` (waiters poll). `get-lock` is `GET_LOCK(name, 30)` / `RELEASE_LOCK` on one session per client; `get-lock-1s` waits in a bounded loop instead (`GET_LOCK(name, 1)` asked again, ctx looked at between asks — the alternative to dlock's `KILL QUERY` for cancelling a wait: the same hand-off, since the server wakes a waiting `GET_LOCK` on release either way, but a cancel takes effect only at the end of the current ask, up to 1s); `shedlock` is ShedLock's statements with the database's time (a conditional `UPDATE` of `lock_until` to lock, one to unlock; it cannot wait, so its waiters retry every 10ms); the floor is `GET_LOCK(name, 0)` / `RELEASE_LOCK`. Server requests: the status variable `Questions` (statements from clients)."},
	{"NATS", "NATS", "nats", nil, "floor",
		"One nats-server (v2.15.2, built from its module) with JetStream, file storage. `dlock` is `nats://` (a bucket of 1 replica); the floor is nats.go's key-value `Create` with the same per-key TTL (`KeyTTL`, 10s) in a bucket configured as the driver's, then `Purge` conditional on the create's revision (`LastRevision`) leaving a marker (`PurgeTTL`): the driver's own two writes, with no loss watch, no token bookkeeping and no lease. nats.go's `Create` is one publish on a new key, but three on a key whose last message is a marker (a refused publish, a read of the marker, the publish again), as here from the second cycle on, for dlock and the floors alike. `floor-watch` is the floor plus a watch of the held key (`KeyValue.Watch`, an ordered consumer, started in the background after the create and stopped at the release, which deletes its consumer): what a loss watch per held lock costs. The driver does not do that: it watches its whole bucket through one ordered consumer, started once, which serves every held lock's loss watch and every waiter. No peer library: NATS users build their lock on `Create`. Server requests: `in_msgs` from `/varz` (messages from clients: key-value writes and reads, JetStream API requests)."},
	{"Kubernetes", "K8s", "", nil, "floor",
		"One kube-apiserver (v1.37.2, built from its module by internal/testenv) over one etcd. `dlock` is `k8s://` (a Lease per key, written with resourceVersion preconditions); the floor is client-go creating the Lease and deleting it conditional on the create's resourceVersion: the least a lock on a Lease takes, with no token (a Lease deleted and created again starts `leaseTransitions` at 0) and no renewal. Run only where the kube-apiserver is built (`DLOCK_K8S=1`). Server requests: each implementation's own HTTP requests, counted on its client (the API server also serves its own controllers)."},
	{"Semaphore and read/write lock: Redis", "Primitives/Redis", "", nil, "floor", primitivesNote},
	{"Semaphore and read/write lock: etcd", "Primitives/Etcd", "", []string{"recipes-rw-read", "recipes-rw-write"}, "floor", primitivesNote + " `recipes-rw-read`/`recipes-rw-write` are etcd's `experimental/recipes` RWMutex (RLock/RUnlock, Lock/Unlock) on one session per client: the only Go peer of either primitive on these backends."},
	{"Semaphore and read/write lock: ZooKeeper", "Primitives/ZooKeeper", "", nil, "floor", primitivesNote},
	{"Semaphore and read/write lock: PostgreSQL", "Primitives/Postgres", "", nil, "floor", primitivesNote},
	{"Semaphore and read/write lock: MySQL (MariaDB)", "Primitives/MySQL", "", nil, "floor", primitivesNote},
	{"Observability overhead (Redis)", "Observe", "", nil, "dlock",
		"One redis-server; dlock with no observer (`dlock`, this table's reference: both ratio columns are against it; `dlock-again` is a second one, an A/A control: its ratio to `dlock` is the noise), and with `dlockotel` over the OpenTelemetry API's no-op providers (`otel-noop`), over the SDK's MeterProvider (manual reader) with a no-op tracer (`otel-metrics`), and over the SDK's MeterProvider and TracerProvider (every span sampled, no exporter: `otel-sdk`). `floor` is the raw Redis floor (as in the Redis table), and `floor+sdk` that floor wrapped in the spans and recordings dlockotel makes, made by hand with the same providers: what the SDK itself costs a cycle. Server requests: as for Redis."},
	{"PostgreSQL, tokens=sequence, step by step", "PostgresSteps", "", nil, "floor",
		"One PostgreSQL server, fsync on: dlock's uncontended cycle with tokens=sequence taken apart. `floor` is `pg_try_advisory_lock` / `pg_advisory_unlock`, as in the PostgreSQL table (where pg-advisory matches it); `sql` is the driver's own two statements for a later lease of its shared session — the acquire (the lock, then nextval if granted, and the session's pid) and the unlock (the session's pid, the unlock) — sent on a pgx connection under `context.Background`; `sql+ctx` the same under a cancellable context, which pgx watches (a `context.AfterFunc` per statement) as it must for any statement that can be bounded or cancelled; `driver` the postgres driver itself, called as the Locker calls it (its pool, its shared session, its statements under a context pgx does not watch, bounded by a deadline on the connection; no Locker); `dlock-seq` the Locker over it. The three token-drawing implementations share one sequence; none of them waits for its WAL (the server's synchronous_commit is off, and so are the driver's sessions' in this mode)."},
}

// primitivesNote says what BenchmarkPrimitives compares.
const primitivesNote = "Packages `semaphore` and `rwlock` on the backend's dlock driver, interleaved with a lock (`dlock`, the reference of the *vs dlock* column) and the backend's floor (as in its own table). `semaphore`: a permit of a semaphore of 4 — where the backend has a semaphore layout of its own (`Capabilities().NativeSemaphore`: Redis, a sorted set of expiring permits; etcd, a waiting room and a lock name per slot; ZooKeeper, Curator's `InterProcessSemaphoreV2`; each checks the size itself) one counted acquire, elsewhere (PostgreSQL, MySQL) a try on a random slot, then the size check: one `dlock.List` of the slots; `semaphore-unchecked`: the same with `WithSizeCheck(false)` (no difference where the layout is the backend's own); `rw-read`/`rw-write`: a read or a write hold of `rwlock` — where the backend holds a lock shared (`Capabilities().Shared`: Redis, PostgreSQL, etcd, ZooKeeper) that is the backend's own shared lock, one lease per hold; elsewhere (MySQL) the portable layout: a read takes the write lock, takes a read slot and gives the write lock back, a write takes the write lock and all 16 read slots, then makes 17 releases. See docs/primitives.md."

// stepBench describes a step-by-step benchmark: one backend's uncontended
// cycle taken apart, its implementations interleaved in the same rounds and
// compared by p50 (the median cycle, which the load of a shared machine
// moves less than the mean).
type stepBench struct {
	title string // "Redis, uncontended, step by step"
	bench string // "RedisSteps/Uncontended": BenchmarkRedisSteps/Uncontended
	ref   string // the step the target compares the last one with
	last  string // the last step: dlock
	note  string
	steps []step // from the floor up
}

// step is one implementation of a step-by-step benchmark, with what it adds
// to the one before.
type step struct{ name, adds string }

var (
	redisSteps = stepBench{"Redis, uncontended, step by step", "RedisSteps/Uncontended", "fenced-floor", "dlock",
		"One redis-server: dlock's uncontended cycle taken apart, from the floor up (BenchmarkRedisSteps). The fenced floor is the reference of Redis's step-by-step target (see Targets): it is the least a lock with dlock's token takes, so no lock with that token can reach more than its ratio to the floor.",
		[]step{
			{"floor", "SET NX PX, then the owner-checked DEL script, as in the Redis table: no token"},
			{"fenced-floor", "dlock's token: dlock's own acquire script with the lock's and the fence's keys only (SET NX PX, and the token drawn: the key's counter plus one, floored at the server's clock in µs, and stored), then the floor's release"},
			{"scripts", "the rest of dlock's two scripts, run on a raw client with every key and argument the driver sends: the check of the key's shared holders, the announcements of the grant and the release (for waiters, followers and Watch), dlock's default label in the lock's value"},
			{"driver", "the redis driver called as the Locker calls it, without a Locker: its client, its arguments and its replies"},
			{"dlock", "dlock.Open: the Locker, its lease and the lease's renewal schedule"},
		}}
	zkSteps = stepBench{"ZooKeeper, uncontended, step by step", "ZooKeeperSteps/Uncontended", "fenced-floor", "dlock",
		"One standalone ZooKeeper: dlock's uncontended cycle taken apart, from the floor up (BenchmarkZooKeeperSteps). The fenced floor is the reference of ZooKeeper's step-by-step target (see Targets): it is the least a lock with dlock's token, granted in one round trip, takes.",
		[]step{
			{"floor", "an ephemeral node created and deleted, as in the ZooKeeper table: no token"},
			{"seq-floor", "the layout of a lock queue: an ephemeral sequential node, named as dlock names its lock nodes and holding a label, under a container node of the key"},
			{"fenced-floor", "dlock's token: the create in one multi with a write to the key's node, whose new mzxid (the transaction's) is the token and whose child count says whether the lock is granted at once"},
			{"driver", "the zookeeper driver called as the Locker calls it, without a Locker"},
			{"dlock", "dlock.Open: the Locker and its lease"},
		}}
	mysqlSteps = stepBench{"MySQL (MariaDB), tokens=sequence, step by step", "MySQLSteps/Uncontended", "floor", "dlock-seq",
		"One MariaDB server, innodb_flush_log_at_trx_commit=1: dlock's uncontended cycle with `tokens=sequence` taken apart, from the floor up (BenchmarkMySQLSteps). None of these steps writes a row or flushes the redo log per grant, and nothing else runs on the server in these rounds (in the MySQL table, counter mode, the table lock and ShedLock, interleaved with `dlock-seq`, flush it on every grant).",
		[]step{
			{"floor", "`GET_LOCK(name, 0)` / `RELEASE_LOCK` on one session, as in the MySQL table: no token"},
			{"sql", "the driver's grant statement for a session that has read its epoch (`GET_LOCK` and the token's draw, `UUID_SHORT()`, in one statement) and `RELEASE_LOCK`, sent as text on one session under `context.Background` (the driver prepares both once per session): the SQL alone"},
			{"sql+pool", "the same on a session taken from a database/sql pool and given back each cycle, as the driver does"},
			{"driver", "the mysql driver itself (its Acquire and Release, as the Locker calls them), without a Locker"},
			{"dlock-seq", "dlock.Open with `tokens=sequence`: the Locker and its lease"},
		}}
	stepBenches = []stepBench{redisSteps, zkSteps, mysqlSteps}
)

// writeSteps writes the table of a step-by-step benchmark, if it ran: each
// step's p50 against the floor's, the reference's and the line above's, as
// ops/s compare (their p50 over this one's), and what it adds to the line
// above, each the median of the per-run figures.
func writeSteps(w *strings.Builder, r *results, sb stepBench) {
	if r.vals[sb.bench] == nil {
		return
	}
	fmt.Fprintf(w, "### %s (runs: %d)\n\n%s\n\n", sb.title, r.runs(sb.bench), sb.note)
	head := "| implementation | what it adds to the line above | ops/s | p50 | p99 | p50 vs floor |"
	rule := "|---|---|---:|---:|---:|---:|"
	if sb.ref != "floor" {
		head += " p50 vs " + sb.ref + " |"
		rule += "---:|"
	}
	fmt.Fprintf(w, "%s p50 vs the line above | p50 added to the line above | errors (all runs) |\n%s---:|---:|---:|\n", head, rule)
	prev := ""
	for _, st := range sb.steps {
		p50, ok := r.get(sb.bench, st.name+".p50-ns")
		if !ok {
			continue
		}
		ops, _ := r.get(sb.bench, st.name+".ops/s")
		p99, ok99 := r.get(sb.bench, st.name+".p99-ns")
		vf, okf := r.ratio(sb.bench, "floor.p50-ns", sb.bench, st.name+".p50-ns")
		cells := fmt.Sprintf("| %s | %s | %s | %s | %s | %s |", st.name, st.adds, num(ops), dur(p50), optDur(p99, ok99), opt(vf, okf, "%.2f×"))
		if sb.ref != "floor" {
			vr, okr := r.ratio(sb.bench, sb.ref+".p50-ns", sb.bench, st.name+".p50-ns")
			cells += " " + opt(vr, okr, "%.2f×") + " |"
		}
		above, added := "", ""
		if prev != "" {
			va, oka := r.ratio(sb.bench, prev+".p50-ns", sb.bench, st.name+".p50-ns")
			d, okd := r.diffMicros(sb.bench, st.name+".p50-ns", prev+".p50-ns")
			above, added = opt(va, oka, "%.2f×"), opt(d, okd, "%+.1f µs")
		}
		fmt.Fprintf(w, "%s %s | %s | %.0f |\n", cells, above, added, sum(r.vals[sb.bench][st.name+".errors"]))
		prev = st.name
	}
	w.WriteString("\n")
}

// stepsWhy says, from a step-by-step benchmark, what each step after the
// reference adds to the p50 of the line above, and how much the target
// (the reference's p50 over the last step's at least target) leaves the last
// step over the reference against what it takes; "" if the benchmark did
// not run.
func stepsWhy(r *results, sb stepBench, target float64) string {
	refs := r.vals[sb.bench][sb.ref+".p50-ns"]
	took, ok := r.diffMicros(sb.bench, sb.last+".p50-ns", sb.ref+".p50-ns")
	if len(refs) == 0 || !ok {
		return ""
	}
	var parts []string
	prev, after := "", false
	for _, st := range sb.steps {
		if after {
			if d, ok := r.diffMicros(sb.bench, st.name+".p50-ns", prev+".p50-ns"); ok {
				parts = append(parts, fmt.Sprintf("%s %+.1f µs", st.name, d))
			}
		}
		after = after || st.name == sb.ref
		prev = st.name
	}
	room := make([]float64, len(refs))
	for i, p := range refs {
		room[i] = p * (1/target - 1) / 1e3
	}
	ref, _ := r.get(sb.bench, sb.ref+".p50-ns")
	return fmt.Sprintf("step by step, interleaved in the same rounds and read by p50 (the %s table), from %s's %s: %s. "+
		"The target leaves %s %.1f µs over %s's p50, and it takes %.1f µs",
		sb.title, sb.ref, dur(ref), strings.Join(parts, ", "), sb.last, median(room), sb.ref, took)
}

func write(w *strings.Builder, r *results, meta [][2]string, cmd, raw string) {
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Generated by `%s` — do not edit; run the script again. ", cmd)
	fmt.Fprintf(w, "Every number below was measured in that one run, against real servers that the benchmarks started on this machine; each is the median over the runs (`-count`), and each ratio is the median of the per-run ratios. A cell with — was not measured (see [Not measured](#not-measured)).\n\n")
	w.WriteString("## Machine\n\n")
	for _, kv := range meta {
		fmt.Fprintf(w, "- **%s**: %s\n", kv[0], kv[1])
	}
	w.WriteString("\nThe machine is shared: other sessions' tests ran during the run (see the load averages), which makes absolute numbers noisy. The uncontended scenario interleaves every implementation of a backend round by round, so that load hits them alike and their ratios stay fair; the other scenarios run one implementation after another.\n\n")

	writeFailures(w, raw)
	writeTargets(w, r)

	w.WriteString("## Uncontended acquire + release\n\n")
	w.WriteString("One client, one key, try-acquire then release, every implementation of the backend once per round, in an order shuffled every round (so that none always follows the same neighbour). ops/s is 1 / mean of the cycles that succeeded; *errors* counts the cycles that failed (logged in the raw output).\n\n")
	for _, be := range backends {
		name := be.bench + "/Uncontended"
		impls := implsOf(r, name, ".ops/s")
		if len(impls) == 0 {
			continue
		}
		fmt.Fprintf(w, "### %s (runs: %d)\n\n%s\n\n", be.title, r.runs(name), be.note)
		w.WriteString("| implementation | ops/s | p50 | p99 | ops/s vs floor | ops/s vs dlock | errors (all runs) |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, im := range impls {
			ops, _ := r.get(name, im+".ops/s")
			p50, _ := r.get(name, im+".p50-ns")
			p99, _ := r.get(name, im+".p99-ns")
			vf, okf := r.ratio(name, im+".ops/s", name, be.floor+".ops/s")
			vd, okd := r.ratio(name, im+".ops/s", name, "dlock.ops/s")
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.0f |\n", im, num(ops), dur(p50), dur(p99), opt(vf, okf, "%.2f×"), opt(vd, okd, "%.2f×"), sum(r.vals[name][im+".errors"]))
		}
		w.WriteString("\n")
		writeHeld(w, r, be)
	}
	for _, sb := range stepBenches {
		writeSteps(w, r, sb)
	}

	w.WriteString("## Contended: 8 and 32 lockers on one key\n\n")
	w.WriteString("Each locker is a client of its own (as a separate process would be) looping lock → unlock. *handoff*: from the start of a release to the grant to a different locker. *changed*: share of grants that went to another locker than the previous one (0% means the releaser always takes the lock straight back). *wait p99*: one waiting lock call. *reqs/grant*: server requests (see each backend's note) per grant. *overlaps*: grants made while another locker held the lock; anything but 0 fails the run. *errors*: lock or unlock calls that failed (logged in the raw output; more than 20 in one run fails it) — a failed release leaves the lock held until its TTL, and the others wait. *rotation*: each locker holds the lock for 2ms, and once it released it does not try again until another locker got the lock, so every grant is a handoff to a locker that was already waiting: there the handoff is how soon a waiter notices a release (for a polling lock, its poll interval). Without rotation, a polling lock's releaser usually takes the lock straight back (low *changed*), and the few handoffs that happen are the lucky fast ones. Floors cannot wait and are not in this table.\n\n")
	for _, be := range backends {
		rows := false
		for _, sc := range []struct{ n, sub string }{{"8", "Contended8"}, {"32", "Contended32"}, {"8, rotation", "Handoff8"}} {
			n := sc.n
			prefix := be.bench + "/" + sc.sub + "/"
			for _, name := range r.order {
				im, ok := strings.CutPrefix(name, prefix)
				if !ok {
					continue
				}
				if !rows {
					fmt.Fprintf(w, "### %s\n\n| lockers | implementation | grants/s | handoff p50 | handoff p99 | changed | wait p99 | reqs/grant | overlaps (max) | errors (all runs) |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n", be.title)
					rows = true
				}
				g, _ := r.get(name, "grants/s")
				h50, ok50 := r.get(name, "handoff-p50-ns")
				h99, ok99 := r.get(name, "handoff-p99-ns")
				ch, okc := r.get(name, "changed-%")
				wp, _ := r.get(name, "wait-p99-ns")
				rq, okr := r.get(name, "reqs/grant")
				ov := slices.Max(append([]float64{0}, r.vals[name]["overlaps"]...))
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f |\n", n, im, num(g), optDur(h50, ok50), optDur(h99, ok99), opt(ch, okc, "%.0f%%"), dur(wp), opt(rq, okr, "%.1f"), ov, sum(r.vals[name]["errors"]))
			}
		}
		if rows {
			w.WriteString("\n")
		}
	}

	writeHandoffSteps(w, r)

	writeGuards(w, r)

	writeSchedule(w, r)

	writeSection(w, r, "Election/Handover/", "## Leader election: hand-over\n\nTwo candidates, each a client of its own, take turns: the leader resigns while the other waits in Campaign (given 5ms to queue); the time is from the start of the resign to the other's Campaign returning. `dlock` is package election on each backend; `etcd-election` is etcd's `concurrency.Election` (a new Election on its session per campaign) on the same etcd server. Its Campaign waits for the previous leader's key with a watch that starts at the revision of its own read, which etcd serves from its unsynced-watcher loop (every 100ms) — the likely cause of its times.\n\n| backend | implementation | hand-over p50 | hand-over p99 |\n|---|---|---:|---:|\n", func(name, rest string) {
		be, im, _ := strings.Cut(rest, "/")
		p50, ok50 := r.get(name, "handover-p50-ns")
		p99, ok99 := r.get(name, "handover-p99-ns")
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", be, im, optDur(p50, ok50), optDur(p99, ok99))
	})

	writeScale(w, r)

	w.WriteString("## Not measured\n\n")
	w.WriteString("- PostgreSQL: the waiters scenario has at most 200 waiters: each waiting Acquire (dlock's, and the raw peer's) takes a connection of its own, and the test server allows 300 connections. Held leases take none of their own: dlock's driver holds them in one session per TTL.\n")
	w.WriteString("- The raw floors have no way to wait: they are in the uncontended and 1 000-keys scenarios only.\n")
	w.WriteString("- Redlock (`dlock-redlock5`, `redsync5`) is in the uncontended and contended scenarios only.\n")
	w.WriteString("- Server requests count what each server's own statistics count (see each backend's note); they are not comparable across backends.\n\n")

	w.WriteString("## Raw output\n\n<details><summary>go test -bench output of this run (for benchstat)</summary>\n\n```\n")
	for line := range strings.Lines(raw) {
		if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "goos") || strings.HasPrefix(line, "goarch") || strings.HasPrefix(line, "cpu") || strings.HasPrefix(line, "pkg") {
			w.WriteString(line)
		}
	}
	w.WriteString("```\n\n</details>\n")
}

// guardsNote is the Guarded writes section's header.
const guardsNote = "## Guarded writes: what a guard adds to a write\n\n" +
	"For each guard (docs/guards.md), the same write to the same server from one client, made plainly and through the guard with a current token, the two interleaved round by round in an order shuffled every round (BenchmarkGuards), each write a new value. " +
	"*plain* and *guarded* are the mean time per write (median over the runs); *guarded / plain* is the median of the per-run ratios, with the lowest and highest run. " +
	"The writes: Redis, SET against redisfence's Set (one script that compares the fence, sets it and the value); etcd, Put against etcdfence's Put (one transaction: compare the fence key, put it and the value); " +
	"ZooKeeper, Set against zkfence's Set (one multi: check the fence node's version, set it and the data); PostgreSQL (fsync and synchronous_commit on) and MariaDB (InnoDB, durable commits), *update*: an UPDATE of one row against SQLGuard.Update of a row with its fence column (one UPDATE … WHERE fence <= token), " +
	"*tx*: a transaction around that UPDATE against SQLGuard.InTx, which fences a row of a fence table in the same transaction; HTTP, a PUT to a bare handler against a PUT with the token header to the handler behind an httpfence.Fence (each on a loopback server of its own). " +
	"Round trips per write, plain against guarded: one against one for Redis, etcd, SQL *update* and HTTP; ZooKeeper's guard reads the fence node and then sends the multi (two against one); SQLGuard.InTx adds the fence row's UPDATE to the transaction (four statements against three: BEGIN, UPDATE, COMMIT). " +
	"S3 is not measured here: s3fence's S3 server for tests lives in an internal package of its own module.\n\n" +
	"| guard | write | plain | guarded | guarded / plain | lowest – highest run |\n|---|---|---:|---:|---:|---:|\n"

// writeGuards writes the Guarded writes section from BenchmarkGuards.
func writeGuards(w *strings.Builder, r *results) {
	writeSection(w, r, "Guards/", guardsNote, func(name, rest string) {
		guard, write, _ := strings.Cut(rest, "/")
		p, okp := r.get(name, "plain.ns/op")
		g, okg := r.get(name, "guarded.ns/op")
		q, okq := r.get(name, "guarded/plain")
		span := "—"
		if qs := r.vals[name]["guarded/plain"]; len(qs) > 0 {
			span = fmt.Sprintf("%.2f× – %.2f×", slices.Min(qs), slices.Max(qs))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", guard, write, optDur(p, okp), optDur(g, okg), opt(q, okq, "%.2f×"), span)
	})
}

// scheduleNote is the Scheduled jobs section's header.
const scheduleNote = "## Scheduled jobs: what a run costs against a bare lock cycle\n\n" +
	"On each backend that can keep package schedule's record (docs/schedule.md), from one Locker, a bare lock cycle (TryAcquire + Release of a new key) against schedule.Run of a new run in Mode NotRepeated and in Mode RetryLost (a job that does nothing, AtMost 10s, no AtLeast) and schedule.Once of a new key, " +
	"the four interleaved round by round in an order shuffled every round (BenchmarkSchedule). *time* is the mean time per call (median over the runs); *× bare cycle* is the median of the per-run ratios to the bare cycle, with the lowest and highest run. " +
	"PostgreSQL (pgtable://) runs with fsync and synchronous_commit on; memlock is in-process, so its ratio is what schedule's own code costs. " +
	"Where the added cost comes from: on Redis and pgtable, a bare cycle is two round trips (the grant and the release), a run or a Once is six: a look for the record, the job's lease, a second look under it, the record's write, the Refresh that has the backend confirm the lease still held once the record is written, and the release. " +
	"Four of the six are writes (the lease, the record, the Refresh, the release) against the bare cycle's two, each a durable commit on PostgreSQL; on etcd, orphaning the record adds a lease grant and a transaction (the record moves to a lease of its own). " +
	"A call that finds the record (every node but the one that ran the run) stops after the first look: one read (on etcd two: the key, then its lease's time to live).\n\n" +
	"| backend | call | time | × bare cycle | lowest – highest run |\n|---|---|---:|---:|---:|\n"

// scheduleCalls are BenchmarkSchedule's calls after the bare cycle, with
// their names in the table.
var scheduleCalls = []struct{ unit, label string }{
	{"notrepeated", "Run, NotRepeated"},
	{"retrylost", "Run, RetryLost"},
	{"once", "Once"},
}

// writeSchedule writes the Scheduled jobs section from BenchmarkSchedule.
func writeSchedule(w *strings.Builder, r *results) {
	writeSection(w, r, "Schedule/", scheduleNote, func(name, backend string) {
		bare, ok := r.get(name, "bare.ns/op")
		fmt.Fprintf(w, "| %s | bare cycle | %s | 1× | |\n", backend, optDur(bare, ok))
		for _, c := range scheduleCalls {
			t, okt := r.get(name, c.unit+".ns/op")
			q, okq := r.get(name, c.unit+"/bare")
			span := "—"
			if qs := r.vals[name][c.unit+"/bare"]; len(qs) > 0 {
				span = fmt.Sprintf("%.2f× – %.2f×", slices.Min(qs), slices.Max(qs))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", backend, c.label, optDur(t, okt), opt(q, okq, "%.2f×"), span)
		}
	})
}

// writeFailures lists the benchmarks that failed in the run, with their
// messages: a failed benchmark prints no numbers, so its cells are missing.
func writeFailures(w *strings.Builder, raw string) {
	var lines []string
	in := false
	for line := range strings.Lines(raw) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "--- FAIL: "):
			in = true
			lines = append(lines, "- `"+strings.TrimPrefix(line, "--- FAIL: ")+"`")
		case in && strings.HasPrefix(line, "    "):
			msg := strings.TrimSpace(line)
			if len(msg) > 400 {
				msg = msg[:400] + "…"
			}
			lines = append(lines, "  - "+strings.ReplaceAll(msg, "|", "\\|"))
		default:
			in = false
		}
	}
	if len(lines) > 0 {
		w.WriteString("## Failures in this run\n\nThese benchmarks failed; their numbers are missing below (a failed benchmark reports none).\n\n")
		for _, l := range lines {
			w.WriteString(l + "\n")
		}
		w.WriteString("\n")
	}
	var notes []string
	for line := range strings.Lines(raw) {
		if _, note, ok := strings.Cut(line, ": NOTE "); ok {
			note = strings.TrimSpace(note)
			if r := []rune(note); len(r) > 400 {
				note = string(r[:400]) + "…"
			}
			notes = append(notes, "- "+strings.ReplaceAll(note, "|", "\\|"))
		}
	}
	if len(notes) > 0 {
		w.WriteString("## Notes from the run\n\nErrors and losses the benchmarks logged (each counted in its table's *errors*, *gave up* or *leases lost* column):\n\n")
		for _, l := range notes {
			w.WriteString(l + "\n")
		}
		w.WriteString("\n")
	}
}

// writeHeld writes the held-cycle and requests-per-cycle table of a backend
// whose benchmark has Held and Requests runs (BenchmarkNATS); nothing
// otherwise.
func writeHeld(w *strings.Builder, r *results, be backend) {
	held, req := be.bench+"/Held", be.bench+"/Requests"
	impls := implsOf(r, held, ".cycle-ns")
	if len(impls) == 0 {
		impls = implsOf(r, req, ".reqs/cycle")
	}
	if len(impls) == 0 {
		return
	}
	if len(implsOf(r, held, ".cycle-ns")) == 0 {
		w.WriteString("Server requests per cycle, one implementation at a time, released at once.\n\n| implementation | requests per cycle |\n|---|---:|\n")
		for _, im := range impls {
			n, ok := r.get(req, im+".reqs/cycle")
			fmt.Fprintf(w, "| %s | %s |\n", im, opt(n, ok, "%.2f"))
		}
		w.WriteString("\n")
		return
	}
	w.WriteString("Held for 20ms: the same interleaved rounds, each lease held 20ms before its release, long enough for a per-key loss watch (floor-watch) to start (*acquire + release*: the mean without the hold; *vs floor*: the floor's time over this one's, as ops/s compare, median of the per-run ratios with the lowest and highest run). Server requests per cycle, one implementation at a time: released at once, as above, and held for 20ms.\n\n")
	w.WriteString("| implementation | held: acquire + release | held: vs floor | requests per cycle | requests per held cycle |\n|---|---:|---:|---:|---:|\n")
	for _, im := range impls {
		c, okc := r.get(held, im+".cycle-ns")
		q, okq := r.ratio(held, be.floor+".cycle-ns", held, im+".cycle-ns")
		vs := opt(q, okq, "%.2f×")
		if lo, hi, n := r.ratioRange(held, be.floor+".cycle-ns", held, im+".cycle-ns"); okq && n > 1 {
			vs += fmt.Sprintf(" (%.2f× – %.2f×)", lo, hi)
		}
		n, okn := r.get(req, im+".reqs/cycle")
		h, okh := r.get(req, im+".reqs/cycle-held")
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", im, optDur(c, okc), vs, opt(n, okn, "%.1f"), opt(h, okh, "%.1f"))
	}
	w.WriteString("\n")
}

// implsOf lists the implementations of a multi-implementation benchmark
// from its units "IMPL<suffix>", dlock first, floor last.
func implsOf(r *results, name, suffix string) []string {
	var out []string
	for unit := range r.vals[name] {
		if im, ok := strings.CutSuffix(unit, suffix); ok {
			out = append(out, im)
		}
	}
	rank := func(s string) int {
		switch {
		case s == "dlock":
			return 0
		case s == "floor":
			return 3
		case strings.HasSuffix(s, "5"):
			return 2
		}
		return 1
	}
	slices.SortFunc(out, func(a, b string) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return out
}

func writeScale(w *strings.Builder, r *results) {
	writeSection(w, r, "Scale/Hold/", "## Many keys held by one process\n\nOne client acquires the keys one after another and holds them all. *per lease*: live heap after GC, per held lease (client side, with the release closures the benchmark keeps), and the goroutines the client runs per held lease.\n\n| backend | implementation | keys | time per acquire | heap per lease | goroutines per lease |\n|---|---|---:|---:|---:|---:|\n", func(name, rest string) {
		be, im, _ := strings.Cut(rest, "/")
		k, _ := r.get(name, "keys")
		a, _ := r.get(name, "acquire-ns")
		b, _ := r.get(name, "B/lease")
		fmt.Fprintf(w, "| %s | %s | %.0f | %s | %s | %s |\n", be, im, k, dur(a), bytes(b), perLease(r, name, "goroutines/lease"))
	})
	writeSection(w, r, "Scale/Keepalive/", "## Keepalive load of many leases (dlock)\n\nOne client holds the leases with auto-renew on; the server requests are counted over one TTL. *expected* is leases / (TTL/3), one renewal per lease per third of a TTL. *acquires retried*: acquires that failed and were tried again (etcd answers \"too many requests\" when it falls behind); *leases lost*: leases whose renewal failed while held (should be 0). Redis: *requests* counts the commands the renewal script runs too; *round trips* counts the script calls.\n\n| backend | leases | TTL | requests/s | round trips/s | expected/s | round trips / expected | heap per lease | goroutines per lease | acquires retried | leases lost |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", func(name, be string) {
		l, _ := r.get(name, "leases")
		ttl, _ := r.get(name, "ttl-s")
		m, _ := r.get(name, "reqs/s")
		e, _ := r.get(name, "expected-reqs/s")
		b, _ := r.get(name, "B/lease")
		trips, okt := r.get(name, "round-trips/s")
		unit := "round-trips/s"
		if !okt {
			trips, unit = m, "reqs/s"
		}
		q, _ := r.ratio(name, unit, name, "expected-reqs/s")
		retried, _ := r.get(name, "acquire-retries")
		lost, _ := r.get(name, "lost")
		fmt.Fprintf(w, "| %s | %.0f | %gs | %s | %s | %s | %.2f× | %s | %s | %.0f | %.0f |\n", be, l, ttl, num(m), num(trips), num(e), q, bytes(b), perLease(r, name, "goroutines/lease"), retried, lost)
	})
	writeSection(w, r, "Scale/Waiters/", "## Many waiters on one key\n\nA holder keeps the key while the waiters line up, then releases; each waiter releases as soon as it gets the lock. *requests per handoff* are counted over the first handoffs (at most 100, at most half the waiters) while most waiters still wait. Three layouts: many waiters over 10 clients; 10 waiters, one per client; up to 100 waiters, one per client (as separate processes). *idle*: server requests per second while the waiters wait and nothing changes hands. O(1) means *many / 10* stays near 1 and the one-per-client column stays near the 10-waiter one. etcd-mutex and pg-advisory always use one client per waiter (one session cannot wait twice on one key). *gave up*: waiters whose lock call failed by itself, over the three layouts (redislock stops waiting after the TTL, 10s); after the measured handoffs the remaining waiters get 30s to go through, then are cancelled.\n\n| backend | implementation | waiters | requests per handoff | with 10 waiters | many / 10 | clients | per handoff, one client per waiter | idle requests/s | gave up |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n", func(name, rest string) {
		be, im, _ := strings.Cut(rest, "/")
		n, _ := r.get(name, "waiters")
		many, _ := r.get(name, "reqs/handoff")
		few, _ := r.get(name, "reqs/handoff@10")
		q, _ := r.ratio(name, "reqs/handoff", name, "reqs/handoff@10")
		c, _ := r.get(name, "clients")
		own, _ := r.get(name, "reqs/handoff@clients")
		idle, _ := r.get(name, "idle-reqs/s")
		gave, _ := r.get(name, "gave-up")
		fmt.Fprintf(w, "| %s | %s | %.0f | %.1f | %.1f | %.2f | %.0f | %.1f | %s | %.0f |\n", be, im, n, many, few, q, c, own, num(idle), gave)
	})
}

// perLease formats a per-lease figure to two decimals, or "–" for a run
// that did not report it.
func perLease(r *results, name, unit string) string {
	v, ok := r.get(name, unit)
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

// writeSection writes header and then one row (by row, given the benchmark's
// name and what follows prefix in it) per benchmark whose name starts with
// prefix, and a blank line; nothing at all if no benchmark matches.
func writeSection(w *strings.Builder, r *results, prefix, header string, row func(name, rest string)) {
	rows := false
	for _, name := range r.order {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		if !rows {
			w.WriteString(header)
			rows = true
		}
		row(name, rest)
	}
	if rows {
		w.WriteString("\n")
	}
}

// target is one line of the targets table.
type target struct {
	what, measured, verdict, note string
}

func writeTargets(w *strings.Builder, r *results) {
	var ts []target
	// add appends a target measured as the median per-run ratio na.ua / nb.ub
	// (with the range over the runs, when there are several); met tells
	// whether v meets it, missBy how far it is off.
	add := func(what, format string, na, ua, nb, ub string, met func(v float64) bool, missBy func(v float64) string, why string) {
		t := target{what: what, measured: "—", verdict: "not measured"}
		if v, ok := r.ratio(na, ua, nb, ub); ok {
			t.measured = fmt.Sprintf(format, v)
			if lo, hi, n := r.ratioRange(na, ua, nb, ub); n > 1 {
				t.measured += " (" + fmt.Sprintf(format, lo) + " – " + fmt.Sprintf(format, hi) + ")"
			}
			if met(v) {
				t.verdict = "met"
			} else {
				t.verdict = "**missed** " + missBy(v)
				t.note = why
			}
		}
		ts = append(ts, t)
	}
	atLeast := func(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
	shortBy := func(x float64) func(float64) string {
		return func(v float64) string { return fmt.Sprintf("by %.0f%%", (x-v)/x*100) }
	}
	// infoIn adds a ratio that is not a target, printed with format.
	infoIn := func(format, what, na, ua, nb, ub string) {
		t := target{what: "(for information) " + what, measured: "—", verdict: "not a target"}
		if v, ok := r.ratio(na, ua, nb, ub); ok {
			t.measured = fmt.Sprintf(format, v)
			if lo, hi, n := r.ratioRange(na, ua, nb, ub); n > 1 {
				t.measured += " (" + fmt.Sprintf(format, lo) + " – " + fmt.Sprintf(format, hi) + ")"
			}
		}
		ts = append(ts, t)
	}
	info := func(what, na, ua, nb, ub string) { infoIn("%.2f×", what, na, ua, nb, ub) }

	floorWhy := map[string]string{
		"Redis":           "the same two round trips as the floor, but both are Lua scripts (Redis 7 has no conditional delete without a script; DELEX … IFEQ came in 8.4). Most of the gap is the token itself: a fencing token that stays above every earlier one across a failover or a lost counter must be drawn in the script that takes the lock (the key's counter plus one, floored at the server's clock in µs, and stored), and that script alone, with nothing else of dlock's, reaches only the fenced floor's ratio to the floor (the fenced-floor lines below; inside Redis each command a script runs costs several µs). The rest is the shared holders' check, the grant's and the release's announcements (followers, waiters) and the lease: dlock / fenced floor below",
		"PostgreSQL":      "the acquire statement also increments the durable fence counter in table `dlock_fence` and commits it with synchronous_commit=local: a WAL flush per grant, on a server with fsync on; the floor and pg-advisory only take the advisory lock. tokens=sequence (next line) removes the flush",
		"MySQL (MariaDB)": "a grant is two statements, GET_LOCK and the committed counter (a redo-log flush per grant with innodb_flush_log_at_trx_commit=1); the floor takes the lock alone, with no token. tokens=sequence (the MySQL lines below) writes nothing per grant",
		"ZooKeeper":       zkFloorWhy(r),
		"Kubernetes":      "three API requests against the floor's two: a read of the Lease (the resourceVersion the grant's update is conditional on, and the leaseTransitions its token counts), the grant's update and the release's update, which keeps the Lease so that its count goes on; the floor creates the Lease and deletes it, with no token (see the requests table under the Kubernetes table)",
		"NATS":            "the same create and purge as the floor; the driver's one bucket-wide watch (an ordered consumer) also delivers dlock's own writes back to it, and a held lease's loss watch is registered with it (see the held table under the NATS table)",
	}
	peerWhy := map[string]string{
		"Redis":           "as for the floor: redislock is SET NX PX + a release script, with no fencing token (the fenced-floor lines below) and no release announcement",
		"PostgreSQL":      "as for the floor: pg-advisory takes no fencing token",
		"MySQL (MariaDB)": "as for the floor: get-lock and get-lock-1s take no fencing token, and shedlock's lock is one UPDATE that keeps no counter",
	}
	for _, be := range backends {
		name := be.bench + "/Uncontended"
		if _, ok := r.get(name, "dlock.ops/s"); !ok || be.floor == "dlock" || strings.HasPrefix(be.bench, "Primitives/") {
			continue // the primitives' tables compare against a lock: no target of their own yet
		}
		fm := 0.9
		if be.title == "ZooKeeper" {
			fm = 0.95 // issue 41
		}
		add(fmt.Sprintf("%s: dlock uncontended ops/s ≥ %g× the raw floor", be.title, fm), "%.2f×", name, "dlock.ops/s", name, be.floor+".ops/s",
			atLeast(fm), shortBy(fm), orNoise(floorWhy[be.title]))
		best, bestV := "", 0.0
		for _, p := range be.peers {
			if pv, ok := r.get(name, p+".ops/s"); ok && pv > bestV {
				best, bestV = p, pv
			}
		}
		if best != "" {
			add(fmt.Sprintf("%s: dlock uncontended ops/s ≥ 1.0× the best peer (%s)", be.title, best), "%.2f×", name, "dlock.ops/s", name, best+".ops/s",
				atLeast(1), shortBy(1), orNoise(peerWhy[be.title]))
		}
	}
	// Issue 41: dlock against the least a lock with its token takes (Redis,
	// ZooKeeper), and MySQL's sequence mode against the raw floor; each once
	// from the backend's benchmark and once from its step-by-step one.
	add("Redis: dlock uncontended ops/s ≥ 0.95× its fenced floor (dlock / fenced-floor: the floor with dlock's token, the least a lock with that token takes)", "%.2f×",
		"Redis/Uncontended", "dlock.ops/s", "Redis/Uncontended", "fenced-floor.ops/s",
		atLeast(0.95), shortBy(0.95), redisFencedWhy(r))
	add("Redis, step by step: dlock ≥ 0.95× its fenced floor by p50 (fenced-floor p50 / dlock p50, the steps interleaved in the same rounds)", "%.2f×",
		redisSteps.bench, "fenced-floor.p50-ns", redisSteps.bench, "dlock.p50-ns",
		atLeast(0.95), shortBy(0.95), orNoise(stepsWhy(r, redisSteps, 0.95)))
	add("ZooKeeper, step by step: dlock ≥ 0.95× the fenced floor by p50 (fenced-floor p50 / dlock p50: the floor with dlock's token, the reference for a driver whose token is a write in the create's transaction)", "%.2f×",
		zkSteps.bench, "fenced-floor.p50-ns", zkSteps.bench, "dlock.p50-ns",
		atLeast(0.95), shortBy(0.95), orNoise(stepsWhy(r, zkSteps, 0.95)))
	infoIn("%.2f×", "ZooKeeper, step by step: the fenced floor / the floor by p50 (floor p50 / fenced-floor p50: what dlock's token, a write to the key's node in the create's transaction, costs; the most any lock with that token reaches against the raw floor)",
		zkSteps.bench, "floor.p50-ns", zkSteps.bench, "fenced-floor.p50-ns")
	ts[len(ts)-1].note = "the raw floor (an ephemeral create and delete, no token) is not the right reference for a driver whose token costs a write in the same transaction: the step-by-step line above compares dlock with the fenced floor"
	add("PostgreSQL, tokens=sequence: dlock uncontended ops/s ≥ 0.85× pg-advisory (dlock-seq / pg-advisory)", "%.2f×",
		"Postgres/Uncontended", "dlock-seq.ops/s", "Postgres/Uncontended", "pg-advisory.ops/s",
		atLeast(0.85), shortBy(0.85), seqWhy(r))
	add("MySQL (MariaDB), tokens=sequence: dlock uncontended ops/s ≥ 0.85× the raw GET_LOCK floor (dlock-seq / floor)", "%.2f×",
		"MySQL/Uncontended", "dlock-seq.ops/s", "MySQL/Uncontended", "floor.ops/s",
		atLeast(0.85), shortBy(0.85), mysqlSeqWhy(r))
	add("MySQL (MariaDB), tokens=sequence, step by step: dlock ≥ 0.85× the floor by p50 (floor p50 / dlock-seq p50, with nothing else on the server writing)", "%.2f×",
		mysqlSteps.bench, "floor.p50-ns", mysqlSteps.bench, "dlock-seq.p50-ns",
		atLeast(0.85), shortBy(0.85), orNoise(stepsWhy(r, mysqlSteps, 0.85)))
	infoIn("%.2f×", "MySQL (MariaDB), tokens=sequence, step by step: the driver's SQL alone / the floor by p50 (floor p50 / sql p50: the grant statement, which draws the token, and RELEASE_LOCK on one session; the most the driver's statements let it reach)",
		mysqlSteps.bench, "floor.p50-ns", mysqlSteps.bench, "sql.p50-ns")
	// The A/A control: a second, identical dlock in the same rounds. Its ratio
	// to dlock is what this machine's noise does to a ratio of two equals.
	const ob = "Observe/Uncontended"
	aaLo := 1.0
	if lo, _, n := r.ratioRange(ob, "dlock-again.ops/s", ob, "dlock.ops/s"); n > 0 {
		aaLo = lo
	}
	add("Observability: dlockotel over the API's no-op providers costs nothing measurable (otel-noop / dlock ≥ 0.97, or no lower than the A/A control dlock-again / dlock in its worst run)", "%.2f×",
		ob, "otel-noop.ops/s", ob, "dlock.ops/s",
		func(v float64) bool { return v >= 0.97 || v >= aaLo }, shortBy(0.97), orNoise(""))
	sdkWhy := "the SDK's own work per acquire+release: two sampled spans (acquire, release; renewals and a loss add short spans of their own) and three instrument recordings (leases held is read at collection). In a hot loop on mem:// that is ≈ 5 µs of CPU per cycle (dlockotel BenchmarkOverhead), but in place, after each round trip, the SDK's code and data are cold on this 2-core machine"
	sdk, okSDK := r.addedMicros(ob, "floor+sdk.ops/s", "floor.ops/s")
	own, okOwn := r.addedMicros(ob, "otel-sdk.ops/s", "dlock.ops/s")
	cycle, okCycle := r.get(ob, "dlock.ops/s")
	if okSDK && okOwn && okCycle {
		fr, _ := r.ratio(ob, "floor+sdk.ops/s", ob, "floor.ops/s")
		budget := 0.05 * 1e6 / cycle
		verdict := "more than 5%% of dlock's cycle (%.1f µs of %.0f µs), so no observer that starts and ends these spans on the caller's path can meet the target here"
		if sdk <= budget {
			verdict = "within 5%% of dlock's cycle (%.1f µs of %.0f µs): the rest is dlockotel's"
		}
		sdkWhy += fmt.Sprintf(". The same spans and recordings made by hand around the raw floor (floor+sdk) add %.1f µs a cycle (floor+sdk / floor %.2f×): "+
			verdict+"; dlockotel adds %.1f µs in all. Sample spans (sdktrace.TraceIDRatioBased) to pay less",
			sdk, fr, budget, 1e6/cycle, own)
	}
	add("Observability: ≤ 5% with the OpenTelemetry SDK, metrics and every span (otel-sdk / dlock ≥ 0.95)", "%.2f×",
		ob, "otel-sdk.ops/s", ob, "dlock.ops/s",
		atLeast(0.95), shortBy(0.95), sdkWhy)
	add("Redis, 8 lockers in rotation: dlock handoff p50 ≥ 50× better than redsync's polling (redsync p50 / dlock p50)", "%.0f×",
		"Redis/Handoff8/redsync", "handoff-p50-ns", "Redis/Handoff8/dlock", "handoff-p50-ns",
		atLeast(50), func(v float64) string { return fmt.Sprintf("(%.0f× of 50×)", v) },
		"redsync's waiters poll every 50–250ms (random); with 7 waiters polling, the first of them to retry after a release comes a fraction of that interval later; dlock's handoff is a pub/sub wake-up plus a script round trip from every waiting client (see reqs/grant)")
	add("Redlock over 5 nodes: uncontended p50 ≤ 1.5× single Redis (dlock-redlock5 / dlock)", "%.2f×",
		"Redis/Uncontended", "dlock-redlock5.p50-ns", "Redis/Uncontended", "dlock.p50-ns",
		func(v float64) bool { return v <= 1.5 }, func(v float64) string { return fmt.Sprintf("by %.0f%%", (v/1.5-1)*100) },
		"the five requests go out in parallel, so latency is set by the slower replies and the client's fan-out; on this 2-core machine the five redis-servers and the client compete for the cores (redsync shows the same cost: see the next line)")
	for _, tr := range []struct{ what, na, ua, nb, ub string }{
		{"redsync: 5 pools / 1 pool, uncontended p50", "Redis/Uncontended", "redsync5.p50-ns", "Redis/Uncontended", "redsync.p50-ns"},
		{"etcd: dlock's read hold / the recipes RWMutex's RLock+RUnlock, uncontended ops/s", "Primitives/Etcd/Uncontended", "rw-read.ops/s", "Primitives/Etcd/Uncontended", "recipes-rw-read.ops/s"},
		{"etcd: dlock's write hold / the recipes RWMutex's Lock+Unlock, uncontended ops/s", "Primitives/Etcd/Uncontended", "rw-write.ops/s", "Primitives/Etcd/Uncontended", "recipes-rw-write.ops/s"},
		{"Redis, 8 lockers without rotation: redsync handoff p50 / dlock's", "Redis/Contended8/redsync", "handoff-p50-ns", "Redis/Contended8/dlock", "handoff-p50-ns"},
		{"Redis, 32 lockers without rotation: redsync handoff p50 / dlock's", "Redis/Contended32/redsync", "handoff-p50-ns", "Redis/Contended32/dlock", "handoff-p50-ns"},
		{"Redis: the fenced floor / the floor, uncontended ops/s (what dlock's token alone costs: one script that takes the lock and draws the token instead of a bare SET NX PX; the most any lock with that token can reach against the floor here)", "Redis/Uncontended", "fenced-floor.ops/s", "Redis/Uncontended", "floor.ops/s"},
		{"Observability, A/A control: a second dlock with no observer in the same rounds / dlock, uncontended ops/s (the noise of a ratio of two equals)", "Observe/Uncontended", "dlock-again.ops/s", "Observe/Uncontended", "dlock.ops/s"},
	} {
		info(tr.what, tr.na, tr.ua, tr.nb, tr.ub)
	}
	// The time Redis spends running scripts per uncontended cycle
	// (BenchmarkRedis/ServerTime), for the floor and peer targets above.
	if _, ok := r.get("Redis/ServerTime", "floor.script-us"); ok {
		parts := []string{}
		for _, n := range []string{"dlock", "dlock-fair", "floor", "fenced-floor", "redislock", "redsync"} {
			if v, ok := r.get("Redis/ServerTime", n+".script-us"); ok {
				parts = append(parts, fmt.Sprintf("%s %.1f µs", n, v))
			}
		}
		ts = append(ts, target{what: "(for information) Redis: time the server spends running scripts per uncontended acquire + release (INFO commandstats; the floor's SET NX PX, about 1 µs, is not a script)",
			measured: strings.Join(parts, ", "), verdict: "not a target"})
	}
	kaWhy := map[string]string{}
	kaNote := map[string]string{
		"etcd":      "the leases of one TTL are keys of one shared etcd lease: one KeepAliveOnce about six times per TTL however many leases, and the renewals share the check of their keys (one transaction of up to 100 Gets per 10ms)",
		"zookeeper": "the session keeps the nodes; the renewals share one sync (at most one per 10ms), and a lease's own read (with a watch) comes only at its first renewal",
		"postgres":  "the leases share one session per TTL, renewed by one ping (at most one per 10ms)",
	}
	memWhy := map[string]string{}
	for _, be := range []string{"redis", "etcd", "zookeeper", "postgres"} {
		name := "Scale/Keepalive/" + be
		l, ok := r.get(name, "leases")
		if !ok {
			continue
		}
		unit := "round-trips/s"
		if _, ok := r.get(name, unit); !ok {
			unit = "reqs/s"
		}
		what := fmt.Sprintf("%s: keepalive of %.0f leases ≤ 1.25 × leases/(TTL/3) requests/s (one per lease renewal at most; fewer where a session renews them)", be, l)
		if lost, ok := r.get(name, "lost"); ok && lost > 0 {
			ts = append(ts, target{what: what, measured: fmt.Sprintf("%.0f leases lost", lost), verdict: "**missed**: leases were lost, so the request rate means nothing", note: "renewals failed while the leases were held; the first error is under \"Notes from the run\""})
		} else {
			add(what, "%.2f× expected", name, unit, name, "expected-reqs/s",
				func(v float64) bool { return v <= 1.25 }, func(v float64) string { return fmt.Sprintf("(%.2f×)", v) }, kaWhy[be])
			if n := kaNote[be]; n != "" && ts[len(ts)-1].note == "" {
				ts[len(ts)-1].note = n
			}
		}
		t := target{what: fmt.Sprintf("%s: < 1 KiB heap per lease with %.0f leases (issue 16)", be, l), measured: "—", verdict: "not measured"}
		if b, ok := r.get(name, "B/lease"); ok {
			t.measured = fmt.Sprintf("%.0f B", b)
			t.verdict = "met"
			if b >= 1024 {
				t.verdict = fmt.Sprintf("**missed** by %.0f%%", (b/1024-1)*100)
				t.note = memWhy[be]
			}
		}
		ts = append(ts, t)
	}
	for _, name := range r.order {
		rest, ok := strings.CutPrefix(name, "Scale/Waiters/")
		if !ok || !strings.HasSuffix(rest, "/dlock") {
			continue
		}
		be := strings.TrimSuffix(rest, "/dlock")
		n, _ := r.get(name, "waiters")
		c, _ := r.get(name, "clients")
		why := ""
		if be == "redis" {
			why = "a release is published to every client that waits on the key, and each client's waiter tries again: requests per handoff grow with the number of waiting clients, not with the waiters inside one client (which share its subscription)"
		}
		within := func(v float64) bool { return v <= 2 }
		times := func(v float64) string { return fmt.Sprintf("(%.1f×)", v) }
		add(fmt.Sprintf("%s: %.0f waiters over 10 clients cost O(1) requests per handoff (≤ 2× the cost with 10 waiters)", be, n), "%.2f×",
			name, "reqs/handoff", name, "reqs/handoff@10", within, times, why)
		add(fmt.Sprintf("%s: %.0f waiters, one client each, cost O(1) requests per handoff (≤ 2× the cost with 10)", be, c), "%.2f×",
			name, "reqs/handoff@clients", name, "reqs/handoff@10", within, times, why)
	}

	if name := "Scale/Waiters/redis/dlock-fair"; r.vals[name] != nil {
		c, _ := r.get(name, "clients")
		add(fmt.Sprintf("redis fair mode (issue 16): %.0f waiters, one client each, cost O(1) requests per handoff (≤ 1.2× the cost with 10)", c), "%.2f×",
			name, "reqs/handoff@clients", name, "reqs/handoff@10",
			func(v float64) bool { return v <= 1.2 }, func(v float64) string { return fmt.Sprintf("(%.2f×)", v) }, orNoise(""))
	}
	add("redis fair mode (issue 16): handoff p50 ≤ 2 round trips (dlock-fair's hand-off p50 / a script call's round trip p50, both made from the same idle state in the same rounds: the hand-off steps below)", "%.2f",
		hs, "dlock-fair.handoff-p50-ns", hs, "script.rtt-p50-ns",
		func(v float64) bool { return v <= 2 }, func(v float64) string { return fmt.Sprintf("(%.2f round trips)", v) }, orNoise(fairWhy(r)))
	infoIn("%.2f", "Redis fair mode: dlock-fair's hand-off p50 in PING round trips from the same idle state (the hand-off steps)", hs, "dlock-fair.handoff-p50-ns", hs, "ping.rtt-p50-ns")
	infoIn("%.2f", "Redis fair mode: the raw direct hand-off's p50 in PING round trips from the same idle state (handoff-floor, the hand-off steps: the least a hand-off by script and message takes here)", hs, "handoff-floor.handoff-p50-ns", hs, "ping.rtt-p50-ns")
	for _, tr := range []struct{ what, na, ua, nb, ub string }{
		{"Redis fair mode: dlock-fair's hand-off p50 / the raw direct hand-off's (the hand-off steps: what dlock's scripts, the driver and the Locker add to one script and one message)", hs, "dlock-fair.handoff-p50-ns", hs, "handoff-floor.handoff-p50-ns"},
		{"Redis fair mode, 8 lockers in rotation: dlock-fair's handoff p50 / the uncontended floor p50 (two round trips of a busy loop, not from idle: the yardstick of earlier reports)", "Redis/Handoff8/dlock-fair", "handoff-p50-ns", "Redis/Uncontended", "floor.p50-ns"},
		{"Redis fair mode, 8 lockers in rotation: dlock-fair's handoff p50 / the raw direct hand-off's (Handoff8 dlock-fair / handoff-floor)", "Redis/Handoff8/dlock-fair", "handoff-p50-ns", "Redis/Handoff8/handoff-floor", "handoff-p50-ns"},
	} {
		info(tr.what, tr.na, tr.ua, tr.nb, tr.ub)
	}
	add("Redis fair mode: dlock-fair uncontended ops/s vs dlock (what the queue costs when nobody waits)", "%.2f×",
		"Redis/Uncontended", "dlock-fair.ops/s", "Redis/Uncontended", "dlock.ops/s",
		func(v float64) bool { return v >= 0.95 }, shortBy(0.95), orNoise(""))

	w.WriteString("## Targets (issue 8), as ratios from this run\n\nMedian of the per-run ratios; in brackets, the lowest and highest run.\n\n| target | measured | verdict | why, where missed |\n|---|---:|---|---|\n")
	for _, t := range ts {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.what, t.measured, t.verdict, t.note)
	}
	w.WriteString("\n")
}

// hs is BenchmarkRedisHandoffSteps' results (see writeHandoffSteps).
const hs = "RedisHandoffSteps/Handoff"

// fairWhy explains the fair mode's hand-off target, from the hand-off steps
// (BenchmarkRedisHandoffSteps).
func fairWhy(r *results) string {
	why := "dlock-fair's hand-off is one script (the release, which makes the head of the queue the holder) and one message; the waiter makes no request"
	var parts []string
	for _, st := range handoffSteps[1:] {
		if v, ok := r.ratio(hs, st.name+".handoff-p50-ns", hs, "handoff-floor.handoff-p50-ns"); ok {
			parts = append(parts, fmt.Sprintf("%s %.2f×", st.name, v))
		}
	}
	if len(parts) == 0 {
		return why
	}
	why += ". Against the raw direct hand-off (one script, one message, no token) in the same rounds: " + strings.Join(parts, ", ")
	if v, ok := r.ratio(hs, "handoff-floor.handoff-p50-ns", hs, "script.rtt-p50-ns"); ok {
		why += fmt.Sprintf(". The raw direct hand-off alone takes %.2f script round trips, so the target leaves dlock %.0f%% over it; "+
			"most of what dlock adds is its scripts (on a hand-off its release script runs 15 commands, the raw one 4: see docs/redis.md)", v, (2/v-1)*100)
	}
	return why
}

// handoffSteps are BenchmarkRedisHandoffSteps' implementations, in order,
// with what each adds to the one before.
var handoffSteps = []struct{ name, adds string }{
	{"handoff-floor", "the least a direct hand-off takes: a refused waiter queues its id in the acquire script and waits for a message on a channel of its own; the release script makes the head the holder and publishes once (no token, no TTL of waiters)"},
	{"scripts", "dlock's own fair-mode scripts on a raw client, waiting on a channel of its own: the token, the waiters' TTLs and records, the queue as a sorted set, the announcement to followers"},
	{"driver", "the redis driver with fair=true, called as the Locker calls it: its pub/sub multiplexer (one connection per client, whose reader dispatches the hand-off to the waiting call) and its check of the hand-off's time"},
	{"dlock-fair", "dlock.Open with ?fair=true: the Locker, its lease and the lease's renewal schedule"},
}

// writeHandoffSteps writes the table of BenchmarkRedisHandoffSteps, if it ran.
func writeHandoffSteps(w *strings.Builder, r *results) {
	if r.vals[hs] == nil {
		return
	}
	fmt.Fprintf(w, "## Redis fair mode: the hand-off step by step (runs: %d)\n\n", r.runs(hs))
	w.WriteString("One redis-server; every implementation has two clients, a holder and a waiter, and all of them take turns round by round, in an order shuffled every round, with two round-trip probes. In each turn the holder takes the lock, the waiter calls lock and waits, and once the waiter is in the server's queue the holder keeps the lock 2ms more, with no request meanwhile, and releases; the hand-off is the time from the start of the release to the waiter's lock call returning. The probes wait 2ms too, then make one request on a client of their own: a PING, and a script call (the floor's release script on a key nobody holds: a GET, an LREM and a reply). They are this machine's round trips from the same idle state as a hand-off (for comparison, the Redis uncontended table's floor p50 is two round trips of a busy loop: a SET and a script call). A fair hand-off is a script (the release must check the holder and pick the next waiter in one step), so the target counts script calls.\n\n")
	w.WriteString("| implementation | what it adds to the line above | hand-off p50 | hand-off p99 | p50 vs handoff-floor | p50 in script round trips | p50 in PING round trips |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, st := range handoffSteps {
		p50, ok50 := r.get(hs, st.name+".handoff-p50-ns")
		if !ok50 {
			continue
		}
		p99, ok99 := r.get(hs, st.name+".handoff-p99-ns")
		vf, okf := r.ratio(hs, st.name+".handoff-p50-ns", hs, "handoff-floor.handoff-p50-ns")
		vs, oks := r.ratio(hs, st.name+".handoff-p50-ns", hs, "script.rtt-p50-ns")
		vp, okp := r.ratio(hs, st.name+".handoff-p50-ns", hs, "ping.rtt-p50-ns")
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", st.name, st.adds, dur(p50), optDur(p99, ok99), opt(vf, okf, "%.2f×"), opt(vs, oks, "%.2f"), opt(vp, okp, "%.2f"))
	}
	ping, okp := r.get(hs, "ping.rtt-p50-ns")
	script, oks := r.get(hs, "script.rtt-p50-ns")
	fmt.Fprintf(w, "\nRound trips from idle, p50: PING %s, script call %s.\n\n", optDur(ping, okp), optDur(script, oks))
}

// seqWhy explains the tokens=sequence target: what the acquire is, and where
// its cycle's time goes, step by step from the floor (BenchmarkPostgresSteps).
func seqWhy(r *results) string {
	why := "no WAL flush and no row written per grant: a shared session's later grants are one SELECT (pg_try_advisory_lock, then nextval if granted, and the session's pid; the epoch is the one the session's first grant read), nextval writes WAL once per 32 values, and the grant commits without waiting for it (the driver's sessions run with synchronous_commit off in this mode)"
	const st = "PostgresSteps/Uncontended"
	ratio := func(im string) (float64, bool) { return r.ratio(st, im+".ops/s", st, "floor.ops/s") }
	sql, ok1 := ratio("sql")
	ctx, ok2 := ratio("sql+ctx")
	drv, ok3 := ratio("driver")
	seq, ok4 := ratio("dlock-seq")
	if !(ok1 && ok2 && ok3 && ok4) {
		return why
	}
	// What the target leaves the driver and the Locker: the cycle it allows
	// (the floor's, over 0.85; pg-advisory runs as fast as the floor) less
	// the SQL's, sent as the driver sends it (under a context pgx does not
	// watch, bounded by a deadline on the connection), against what they
	// take; µs of the mean cycle, median over the runs.
	var room []float64
	fl, sq := r.vals[st]["floor.ops/s"], r.vals[st]["sql.ops/s"]
	for i := range min(len(fl), len(sq)) {
		if fl[i] != 0 && sq[i] != 0 {
			room = append(room, 1e6/(0.85*fl[i])-1e6/sq[i])
		}
	}
	took, ok := r.addedMicros(st, "dlock-seq.ops/s", "sql.ops/s")
	if len(room) == 0 || !ok {
		return why
	}
	noise := ""
	if ctx > sql {
		noise = " (it does all the raw statements do and more: the difference is this machine's noise)"
	}
	why += fmt.Sprintf(". Step by step, interleaved on one server (the step-by-step table below, ratios to the floor): "+
		"the driver's two statements sent raw %.2f× (nextval in the server, the session's pid in both); "+
		"under a cancellable context, which pgx watches, %.2f×%s, which the driver avoids: its statements run under a context that cannot end, "+
		"bounded by a deadline on the connection moved a few times a second; the driver without a Locker %.2f×; dlock-seq %.2f×. "+
		"The target allows a cycle of 1/0.85 the floor's (pg-advisory runs as fast as the floor: see the PostgreSQL table); ",
		sql, ctx, noise, drv, seq)
	if rm := median(room); rm <= 0 {
		why += fmt.Sprintf("the SQL alone takes %.1f µs more than that, before any of the driver's own code runs", -rm)
	} else {
		why += fmt.Sprintf("the SQL alone leaves %.1f µs of it to the driver and the Locker, and they take %.1f µs", rm, took)
	}
	return why
}

// redisFencedWhy explains Redis's target against its fenced floor, from the
// server's script time (BenchmarkRedis/ServerTime) and the step-by-step
// benchmark (BenchmarkRedisSteps).
func redisFencedWhy(r *results) string {
	why := "the fenced floor runs dlock's acquire script with the lock's and the fence's keys only; dlock's scripts also check the key's shared holders and announce the grant and the release (for waiters, followers and Watch), and the driver and the Locker run on the caller's path"
	d, okd := r.get("Redis/ServerTime", "dlock.script-us")
	f, okf := r.get("Redis/ServerTime", "fenced-floor.script-us")
	if okd && okf {
		why += fmt.Sprintf(". The server spends %.1f µs running dlock's scripts per cycle against %.1f µs for the fenced floor's (INFO commandstats: the server-time line below)", d, f)
	}
	if v, ok := r.ratio(redisSteps.bench, "fenced-floor.p50-ns", redisSteps.bench, "dlock.p50-ns"); ok {
		why += fmt.Sprintf(". By p50, in the step-by-step rounds, dlock is at %.2f× the fenced floor; where the time goes: the next line", v)
	}
	return why
}

// zkFloorWhy explains ZooKeeper's target against the raw floor, from the
// step-by-step benchmark (BenchmarkZooKeeperSteps).
func zkFloorWhy(r *results) string {
	why := "the raw floor (an ephemeral create and delete, no token) is not the right reference for a driver whose token costs a write in the same transaction: dlock's create runs in one multi with a write to the key's node, whose new mzxid is the token"
	b := zkSteps.bench
	seq, ok1 := r.ratio(b, "floor.p50-ns", b, "seq-floor.p50-ns")
	fen, ok2 := r.ratio(b, "floor.p50-ns", b, "fenced-floor.p50-ns")
	dl, ok3 := r.ratio(b, "fenced-floor.p50-ns", b, "dlock.p50-ns")
	if !ok1 || !ok2 || !ok3 {
		return why
	}
	return why + fmt.Sprintf(". Step by step, by p50 in the same rounds (the ZooKeeper step-by-step table): the lock queue's layout alone (seq-floor) at %.2f× the floor, the fenced floor at %.2f×, the most any lock with that token reaches here; dlock at %.2f× the fenced floor (the step-by-step target below)", seq, fen, dl)
}

// mysqlSeqWhy explains MySQL's tokens=sequence targets, from the MySQL
// table and the step-by-step benchmark (BenchmarkMySQLSteps).
func mysqlSeqWhy(r *results) string {
	why := "tokens=sequence takes the lock and draws the token in one statement (GET_LOCK, then UUID_SHORT(), a counter in the server's memory) and writes nothing, so no grant waits for a redo-log flush"
	const mu = "MySQL/Uncontended"
	if v, ok := r.ratio(mu, "floor.p50-ns", mu, "dlock-seq.p50-ns"); ok {
		why += fmt.Sprintf(". In the MySQL table, where counter mode, the table lock and ShedLock flush the redo log on every grant in the same rounds, dlock-seq is at %.2f× the floor by p50", v)
		if s, ok := r.ratio(mysqlSteps.bench, "floor.p50-ns", mysqlSteps.bench, "dlock-seq.p50-ns"); ok {
			why += fmt.Sprintf("; in the step-by-step rounds, where nothing else writes, at %.2f× by p50 (where the time goes: the next line)", s)
		}
	}
	return why
}

// orNoise is why, or, when there is no known cause, a pointer to the spread
// of the runs.
func orNoise(why string) string {
	if why != "" {
		return why
	}
	return "no cause known beyond the run-to-run spread on this loaded machine (see the range)"
}

func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func dur(ns float64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.0f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func optDur(ns float64, ok bool) string {
	if !ok {
		return "—"
	}
	return dur(ns)
}

func opt(v float64, ok bool, format string) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf(format, v)
}

func bytes(b float64) string {
	if b >= 10*1024 {
		return fmt.Sprintf("%.0f KiB", b/1024)
	}
	return fmt.Sprintf("%.0f B", b)
}
