// Command safety-report runs the fault matrix and the soaks of every driver
// and the guard suite of every guard, and writes docs/SAFETY.md from their
// results, or checks that a committed docs/SAFETY.md still states what the
// tests observe.
//
// From the repository root:
//
//	go run ./conformance/cmd/safety-report              # run the tests, write docs/SAFETY.md
//	go run ./conformance/cmd/safety-report -from DIR    # use results already in DIR
//	go run ./conformance/cmd/safety-report -from DIR -check
//
// Without -from it runs
//
//	go test -run 'Faults|Soak|GuardSuite' -count=1 -timeout 60m ./...
//
// in every module of the repository (through its go.work) whose tests call
// conformance.RunFaults, conformance.Soak or conformance.RunGuardSuite (the
// root and the nested etcd, nats and fencing/s3fence modules), with
// DLOCK_SAFETY_OUT set to a new temporary directory, where they append their
// results (see conformance.Record), and keeps
// going when a test fails: the report shows the failed cells. Set
// DLOCK_FAULT_TRIALS to run more trials per cell. -from reads the results of
// an earlier run, such as CI's `go test ./...` with DLOCK_SAFETY_OUT set.
//
// -check compares the claims of the report it would write — each row's
// deployment, fault, expected outcome and status (pass, skipped with its
// reason, FAILED) — with those of the committed file, and exits 1 on a
// difference; the observed outcome (which may vary within the expected set
// from run to run), the latencies and the counts are not compared. It
// compares every cell of the Guards table (each guard on its server × each
// case of the guard suite: pass, skipped with its reason, FAILED) too. A row
// or cell of the committed file that the results lack is a difference, as is
// one the file lacks. With -check nothing is written.
//
// -only guards takes only the guard suite's results: it rewrites only the
// Guards section of the report, keeping the rest of the file (the fault
// matrix, the soaks) and README.md as they are, and -check compares only the
// Guards cells. -only locks takes only the fault matrix's and the soaks'
// results, keeps the file's Guards section, and -check compares all but the
// Guards cells. By default every section is written and compared.
//
// It also writes a summary grid (deployments × faults, the claimed outcome
// of each cell and whether it held) between the markers
//
//	<!-- safety-summary:begin -->
//	<!-- safety-summary:end -->
//
// in README.md, which -check compares too.
//
// -not-run DEP,… (with -check) names deployments whose tests the run did
// not run because they are gated off (k8s without DLOCK_K8S): their
// committed rows, in the report and in README's grid, are left uncompared
// and the output says so; results for one of them are an error.
//
// Flags: -from DIR (default: run the tests), -o FILE (default
// docs/SAFETY.md under the module root), -readme FILE (default README.md
// under the module root; "none" skips the summary), -check, -only
// guards|locks (default: both), -not-run DEP,… (default none), -race (run the tests with the race detector;
// default off, so latencies are not inflated), -run REGEXP (default
// "Faults|Soak|GuardSuite"), -pkgs (default "./...", in each module),
// -timeout (default 60m, per module's go test).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conformance"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "safety-report:", err)
		var d *diffError
		if errors.As(err, &d) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

// diffError is the -check failure: the report's claims differ.
type diffError struct{ diffs []string }

func (e *diffError) Error() string {
	return "docs/SAFETY.md does not match the results:\n  " + strings.Join(e.diffs, "\n  ")
}

const command = "go run ./conformance/cmd/safety-report"

func run(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("safety-report", flag.ContinueOnError)
	fl.SetOutput(stderr)
	from := fl.String("from", "", "read results from this directory instead of running the tests")
	out := fl.String("o", "", "the report to write or check (default docs/SAFETY.md under the module root)")
	check := fl.Bool("check", false, "compare the report's claims with the file and exit 1 on a difference; write nothing")
	race := fl.Bool("race", false, "run the tests with -race")
	runRE := fl.String("run", "Faults|Soak|GuardSuite", "the tests to run")
	only := fl.String("only", "", `"guards" or "locks": take and write (or check) only that part of the report`)
	pkgs := fl.String("pkgs", "./...", "the packages to test, in each module")
	timeout := fl.Duration("timeout", 60*time.Minute, "go test's -timeout, in each module")
	readme := fl.String("readme", "", "the README whose generated summary block to update or check (default README.md under the module root; \"none\" to skip)")
	notRunList := fl.String("not-run", "", "with -check: comma-separated deployments whose tests this run did not run (gated off); their committed rows are kept, not compared")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *only != "" && *only != "guards" && *only != "locks" {
		return fmt.Errorf("-only %q: want guards or locks", *only)
	}
	if *only == "guards" {
		*readme = "none" // the README's grid holds lock cells only
	}
	notRun := map[string]bool{}
	for _, d := range strings.Split(*notRunList, ",") {
		if d = strings.TrimSpace(d); d != "" {
			notRun[d] = true
		}
	}
	if len(notRun) > 0 && !*check {
		return errors.New("-not-run needs -check: a written report takes every row from the results")
	}
	root := ""
	if *out == "" || *readme == "" || *from == "" {
		var err error
		if root, err = moduleRoot(); err != nil {
			return err
		}
		if *out == "" {
			*out = filepath.Join(root, "docs", "SAFETY.md")
		}
		if *readme == "" {
			*readme = filepath.Join(root, "README.md")
		}
	}
	dir := *from
	testErr := error(nil)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "dlock-safety-"); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "safety-report: results in %s\n", dir)
		mods, err := faultModules(root)
		if err != nil {
			return err
		}
		goArgs := []string{"test", "-run", *runRE, "-count=1", "-timeout", timeout.String()}
		if *race {
			goArgs = append(goArgs, "-race")
		}
		goArgs = append(goArgs, strings.Fields(*pkgs)...)
		start := time.Now()
		for _, mod := range mods {
			cmd := exec.Command("go", goArgs...)
			cmd.Dir = mod
			cmd.Env = append(os.Environ(), "DLOCK_SAFETY_OUT="+dir) // the repository's go.work
			cmd.Stdout, cmd.Stderr = stderr, stderr
			fmt.Fprintf(stderr, "safety-report: (cd %s && go %s)\n", mod, strings.Join(goArgs, " "))
			if err := cmd.Run(); err != nil && testErr == nil {
				testErr = fmt.Errorf("%s: %w", mod, err)
			}
		}
		fmt.Fprintf(stderr, "safety-report: tests took %v\n", time.Since(start).Round(time.Second))
	}
	recs, err := readRecords(dir)
	if err != nil {
		return err
	}
	recs = onlyRecords(recs, *only)
	for _, r := range recs {
		if notRun[r.Deployment] {
			return fmt.Errorf("-not-run %s: the results in %s have rows for it (%s %s)", r.Deployment, dir, r.Kind, r.Test)
		}
	}
	if len(recs) == 0 {
		return fmt.Errorf("no results in %s (were the tests run with DLOCK_SAFETY_OUT set?)", dir)
	}
	report := render(recs, machine(), time.Now().UTC())
	if *only != "" {
		old, err := os.ReadFile(*out)
		if err != nil {
			return err
		}
		report = keepPart(string(old), report, *only)
	}
	if *check {
		old, err := os.ReadFile(*out)
		if err != nil {
			return err
		}
		committed := claimsPart(string(old), *only)
		maps.DeleteFunc(committed, func(k, _ string) bool { return notRun[claimDeployment(k)] })
		diffs := compareClaims(committed, claimsPart(report, *only))
		if *readme != "none" {
			text, err := os.ReadFile(*readme)
			if err != nil {
				return err
			}
			if updated, err := spliceSummary(string(text), summary(recs)); err != nil {
				return fmt.Errorf("%s: %w", *readme, err)
			} else if updated != string(text) && (len(notRun) == 0 || !maps.Equal(summaryCells(updated, notRun), summaryCells(string(text), notRun))) {
				diffs = append(diffs, fmt.Sprintf("%s: the safety summary block differs from the results (regenerate it)", *readme))
			}
		}
		if len(diffs) > 0 {
			return &diffError{diffs: diffs}
		}
		fmt.Fprintf(stdout, "safety-report: %s matches the results in %s\n", *out, dir)
		if len(notRun) > 0 {
			fmt.Fprintf(stdout, "safety-report: not compared, their tests did not run: %s\n", strings.Join(slices.Sorted(maps.Keys(notRun)), ", "))
		}
		return testErr
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "safety-report: wrote %s\n", *out)
	if *readme != "none" {
		text, err := os.ReadFile(*readme)
		if err != nil {
			return err
		}
		updated, err := spliceSummary(string(text), summary(recs))
		if err != nil {
			return fmt.Errorf("%s: %w", *readme, err)
		}
		if err := os.WriteFile(*readme, []byte(updated), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "safety-report: updated the summary in %s\n", *readme)
	}
	if testErr != nil {
		return fmt.Errorf("the tests failed (the report shows the failed rows): %w", testErr)
	}
	return nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside a Go module; run from the repository root or pass -o")
	}
	return filepath.Dir(mod), nil
}

// faultModules returns the directory of every module under root (root
// included; not under third_party, testdata or a directory whose name starts
// with "."), whose own test files call conformance.RunFaults,
// conformance.Soak or conformance.RunGuardSuite, in name order.
func faultModules(root string) ([]string, error) {
	uses := map[string]bool{}
	var mods []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "third_party" || name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				mods = append(mods, path)
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("conformance.RunFaults(")) || bytes.Contains(b, []byte("conformance.Soak(")) ||
			bytes.Contains(b, []byte("conformance.RunGuardSuite(")) {
			uses[owningModule(mods, path)] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mods {
		if uses[m] {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no module under %s runs conformance.RunFaults, conformance.Soak or conformance.RunGuardSuite", root)
	}
	return out, nil
}

// owningModule returns the module of mods (directories) that holds path:
// the longest that is a parent of it.
func owningModule(mods []string, path string) string {
	best := ""
	for _, m := range mods {
		if strings.HasPrefix(path, m+string(filepath.Separator)) && len(m) > len(best) {
			best = m
		}
	}
	return best
}

// readRecords reads every *.jsonl file in dir.
func readRecords(dir string) ([]conformance.Record, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var recs []conformance.Record
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			var r conformance.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s:%d: %w", name, n, err)
			}
			recs = append(recs, r)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return recs, nil
}

// merge combines the records of one row from several runs: trials, stale
// writes, overlaps and operations add up, and a failure anywhere fails the
// row. Whether the row was skipped is the newest record's say (by Time): a
// pass left in a reused results directory by an earlier run must not hide
// this run's skip, nor an old skip this run's pass.
func merge(rs []conformance.Record) conformance.Record {
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b conformance.Record) int { return strings.Compare(a.Time, b.Time) })
	m := rs[0]
	m.Skip = rs[len(rs)-1].Skip
	var observed []string
	var p50s []float64
	for i, r := range rs {
		if i > 0 {
			m.Trials += r.Trials
			m.Stale += r.Stale
			m.Overlaps += r.Overlaps
			m.Ops += r.Ops
			m.Failed = m.Failed || r.Failed
			m.LatencyMaxMs = max(m.LatencyMaxMs, r.LatencyMaxMs)
		}
		for _, o := range strings.Split(r.Observed, "|") {
			if o != "" && !slices.Contains(observed, o) {
				observed = append(observed, o)
			}
		}
		if r.LatencyP50Ms >= 0 {
			p50s = append(p50s, r.LatencyP50Ms)
		}
	}
	order := map[string]int{"held": 0, "loss-detected": 1, "safe-with-fencing": 2, "UNSAFE": 3}
	sort.Slice(observed, func(i, j int) bool { return order[observed[i]] < order[observed[j]] })
	if m.Kind == "fault" {
		m.Observed = strings.Join(observed, "|")
	}
	m.LatencyP50Ms = -1
	if len(p50s) > 0 {
		sort.Float64s(p50s)
		m.LatencyP50Ms = p50s[(len(p50s)-1)/2]
	}
	return m
}

func status(r conformance.Record) string {
	switch {
	case r.Failed:
		return "FAILED"
	case r.Skip != "":
		return "skipped: " + r.Skip
	}
	return "pass"
}

func ms(v float64) string {
	if v < 0 {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
}

func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func machine() string {
	host, _ := os.Hostname()
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	s := fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if cpu != "" {
		s += " (" + cpu + ")"
	}
	if host != "" {
		s += ", host " + host
	}
	return s + ", " + runtime.Version()
}

// render writes the report. Rows are sorted by deployment, then by fault in
// the suite's order.
func render(recs []conformance.Record, mach string, now time.Time) string {
	type rowKey struct{ kind, dep, fault string }
	groups := map[rowKey][]conformance.Record{}
	var keys []rowKey
	for _, r := range recs {
		k := rowKey{r.Kind, r.Deployment, r.Fault}
		if r.Kind == "soak" {
			k.fault = ""
		}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	rank := func(f string) int {
		if i := slices.Index(conformance.AllFaults(), conformance.Fault(f)); i >= 0 {
			return i
		}
		return len(conformance.AllFaults())
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.dep != b.dep {
			return a.dep < b.dep
		}
		if rank(a.fault) != rank(b.fault) {
			return rank(a.fault) < rank(b.fault)
		}
		return a.fault < b.fault
	})

	var b bytes.Buffer
	fmt.Fprintf(&b, "# Safety report\n\n")
	fmt.Fprintf(&b, "<!-- Generated by `%s`; do not edit. -->\n\n", command)
	fmt.Fprintf(&b, "Generated by `%s` on %s, on %s. Do not edit this file: regenerate it. "+
		"CI checks it with `%s -from DIR -check` against the results of its own run.\n\n",
		command, now.Format("2006-01-02 15:04 MST"), mach, command)
	b.WriteString(`Each row is one deployment under one fault (see conformance.Fault). A holder takes a
lock with a short TTL and auto-renew and keeps incrementing a counter behind a fencing Guard
(fenced read, think time, fenced write); a contender waits for the lock; the fault hits at a
random phase of the refresh tick and is healed. The leader-, semaphore- and rw- cells repeat
partition and pause-holder with the holder and the contender leading an election (package
election), holding the one permit of a semaphore of 1 (package semaphore), or holding the
write side of a read/write lock (package rwlock). Two cells repeat partition with a crowd:
in semaphore-3-partition the holder takes one permit of a semaphore of 3 and four contenders
take permits of it (two hold the free ones, two wait), each holder incrementing its slot's
counter; in rw-reader-partition the holder reads a read/write lock (fenced reads), a writer
waits for it, and once the writer is in a later reader asks. Their outcome is the holder's
against the first contender granted its slot (the writer); they also fail, whatever they
expect, if more than 3 permits are ever held other than by the lost holder and its slot's
next holder, or a permit lies outside the 3 slots, or the later reader is granted while the
writer holds. Outcomes, best first:

- **held** — the holder kept the lock through the fault; nobody else got it.
- **loss-detected** — the holder's lease ended (Done closed; for a paused process its Deadline
  passed) no later than the contender's grant. Safe without fencing.
- **safe-with-fencing** — the two leases overlapped, and the Guard rejected every stale write.
- **UNSAFE** — a stale write was accepted, an update was lost (porcupine found the counter's
  history not linearizable), or the contender's token was not above the holder's. Documented
  where expected; a change of outcome fails CI.

*Expected* is the claim made in the driver's test file; *status* says whether every trial's
outcome was within it. *Observed* is the union over the trials of this run (it may vary within
the expected set from run to run). Detection latency: the holder's loss time minus the fault's
start. Stale writes accepted counts requests of an older lease accepted after a newer lease's
request reached the resource.

## Fault matrix

| deployment | fault | expected | status | observed | trials | detection p50 / max | stale writes accepted | why |
|---|---|---|---|---|---|---|---|---|
`)
	for _, k := range keys {
		if k.kind != "fault" {
			continue
		}
		r := merge(groups[k])
		observed, expected := r.Observed, r.Expected
		if observed == "" {
			observed = "–"
		}
		if expected == "" || expected == "none" {
			expected = "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %s / %s | %d | %s |\n",
			r.Deployment, r.Fault, cell(expected), cell(status(r)), cell(observed), r.Trials,
			ms(r.LatencyP50Ms), ms(r.LatencyMaxMs), r.Stale, cell(r.Why))
	}
	b.WriteString(`
## Soak

Several processes × lockers on a few keys at a capped rate, a random fault every ~10 s
(conformance.Soak): one key as a lock, one as a semaphore of 1, one as a read/write lock's
write side, in turn (two holds of one name at once are an overlap). A lease ends at the earliest of its Done, its Release call and (if it
was lost) its Deadline. Two leases of one key that overlap fail the soak, unless a fault
whose cell allows safe-with-fencing was in effect: those overlaps are counted here. In
every case the fenced counter must stay linearizable, with no stale write accepted, and
two leases of one lock, the later asked for after the earlier was granted, must have
increasing tokens.

| deployment | status | duration | lockers | faults injected | leases overlapping | requests accepted | stale writes accepted |
|---|---|---|---|---|---|---|---|
`)
	for _, k := range keys {
		if k.kind != "soak" {
			continue
		}
		r := merge(groups[k])
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d (%s) | %d | %d | %d |\n",
			r.Deployment, cell(status(r)), r.Duration, r.Observed, r.Trials, cell(r.Fault), r.Overlaps, r.Ops, r.Stale)
	}
	return spliceGuards(b.String(), renderGuards(recs, mach, now))
}

// onlyRecords returns the records of recs that -only part takes: the guard
// suite's for "guards", the fault matrix's and the soaks' for "locks", all
// for "".
func onlyRecords(recs []conformance.Record, part string) []conformance.Record {
	if part == "" {
		return recs
	}
	return slices.DeleteFunc(slices.Clone(recs), func(r conformance.Record) bool {
		return (r.Kind == "guard") != (part == "guards")
	})
}

// keepPart returns report with the part -only part does not take copied
// from old, the committed report: for "guards" all but the Guards section,
// for "locks" the Guards section.
func keepPart(old, report, part string) string {
	switch part {
	case "guards":
		_, guards, _ := splitGuards(report)
		return spliceGuards(old, guards)
	case "locks":
		_, guards, _ := splitGuards(old)
		return spliceGuards(report, guards)
	}
	return report
}

// claimsPart returns the claims of report (claims) that -check compares
// under -only part.
func claimsPart(report, part string) map[string]string {
	c := claims(report)
	if part != "" {
		maps.DeleteFunc(c, func(k, _ string) bool { return isGuardClaim(k) != (part == "guards") })
	}
	return c
}

// claims extracts, from a report, the columns -check compares: per fault row
// deployment, fault, expected, status; per soak row deployment and status;
// every cell of the Guards table, keyed by guard, server and column.
func claims(report string) map[string]string {
	out := map[string]string{}
	section := ""
	var guardHeader []string
	for _, l := range strings.Split(report, "\n") {
		if strings.HasPrefix(l, "## ") {
			section = strings.TrimPrefix(l, "## ")
			continue
		}
		if section == strings.TrimPrefix(guardsHeading, "## ") && strings.HasPrefix(l, "| guard |") {
			guardHeader = splitRow(l)
			continue
		}
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| deployment") {
			continue
		}
		cols := splitRow(l)
		switch {
		case section == strings.TrimPrefix(guardsHeading, "## ") && len(cols) >= 2:
			for i := 2; i < len(cols) && i < len(guardHeader); i++ {
				out["guard "+cols[0]+" on "+cols[1]+": "+guardHeader[i]] = cols[i]
			}
		case section == "Fault matrix" && len(cols) >= 4:
			out["fault "+cols[0]+" "+cols[1]] = "expected " + cols[2] + ", " + cols[3]
		case section == "Soak" && len(cols) >= 2:
			out["soak "+cols[0]] = cols[1]
		}
	}
	return out
}

// splitRow splits a markdown table row on unescaped "|".
func splitRow(l string) []string {
	var cols []string
	var cur strings.Builder
	l = strings.TrimSpace(l)
	l = strings.TrimPrefix(strings.TrimSuffix(l, "|"), "|")
	for i := 0; i < len(l); i++ {
		switch {
		case l[i] == '\\' && i+1 < len(l) && l[i+1] == '|':
			cur.WriteByte('|')
			i++
		case l[i] == '|':
			cols = append(cols, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(l[i])
		}
	}
	return append(cols, strings.TrimSpace(cur.String()))
}

// claimDeployment is the deployment a claims key names ("fault DEP FAULT",
// "soak DEP", "guard G on SERVER: COLUMN"), or "".
func claimDeployment(key string) string {
	if g, ok := strings.CutPrefix(key, "guard "); ok {
		if _, rest, ok := strings.Cut(g, " on "); ok {
			server, _, _ := strings.Cut(rest, ":")
			return server
		}
		return ""
	}
	f := strings.Fields(key)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

func compareClaims(committed, now map[string]string) []string {
	var diffs []string
	for k, v := range now {
		switch old, ok := committed[k]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: %s, not in the committed report", k, v))
		case old != v:
			diffs = append(diffs, fmt.Sprintf("%s: committed %q, observed %q", k, old, v))
		}
	}
	for k, v := range committed {
		if _, ok := now[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: committed %q, not in the results", k, v))
		}
	}
	sort.Strings(diffs)
	return diffs
}
