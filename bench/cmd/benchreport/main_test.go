package main

import (
	"fmt"
	"strings"
	"testing"
)

// uncontendedLine is a go test -bench line of an interleaved uncontended
// benchmark: p50 in ns per implementation, ops/s set to 1e9 / p50.
func uncontendedLine(name string, p50 map[string]float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Benchmark%s-2 \t 1000\t 1000000 ns/op", name)
	for im, p := range p50 {
		fmt.Fprintf(&b, "\t 0 %s.errors\t %g %s.ops/s\t %g %s.p50-ns\t %g %s.p99-ns", im, 1e9/p, im, p, im, 3*p, im)
	}
	return b.String() + "\n"
}

// stepsRaw is a run of the three step-by-step benchmarks and of the
// uncontended rows their targets compare.
func stepsRaw() string {
	return "goos: linux\n" +
		"BenchmarkRedis/Uncontended-2 \t 1000\t 1000000 ns/op\t 0 dlock.errors\t 5571 dlock.ops/s\t 171000 dlock.p50-ns\t 0 fenced-floor.errors\t 6249 fenced-floor.ops/s\t 151000 fenced-floor.p50-ns\t 0 floor.errors\t 7719 floor.ops/s\t 121000 floor.p50-ns\n" +
		"BenchmarkRedis/ServerTime-2 \t 1000\t 1000000 ns/op\t 18.1 dlock.script-us\t 16.2 fenced-floor.script-us\t 4.5 floor.script-us\n" +
		"BenchmarkZooKeeper/Uncontended-2 \t 1000\t 1000000 ns/op\t 0 dlock.errors\t 2121 dlock.ops/s\t 451000 dlock.p50-ns\t 0 floor.errors\t 2551 floor.ops/s\t 374000 floor.p50-ns\n" +
		"BenchmarkMySQL/Uncontended-2 \t 1000\t 1000000 ns/op\t 0 dlock-seq.errors\t 3500 dlock-seq.ops/s\t 300000 dlock-seq.p50-ns\t 0 floor.errors\t 4200 floor.ops/s\t 246000 floor.p50-ns\n" +
		uncontendedLine("RedisSteps/Uncontended", map[string]float64{"floor": 80000, "fenced-floor": 86000, "scripts": 89000, "driver": 90000, "dlock": 94000}) +
		uncontendedLine("ZooKeeperSteps/Uncontended", map[string]float64{"floor": 400000, "seq-floor": 405000, "fenced-floor": 420000, "driver": 430000, "dlock": 436000}) +
		uncontendedLine("MySQLSteps/Uncontended", map[string]float64{"floor": 246000, "sql": 260000, "sql+pool": 262000, "driver": 250000, "dlock-seq": 255000})
}

// renderRaw is the report benchreport writes from raw, a go test -bench
// output.
func renderRaw(t *testing.T, raw string) string {
	t.Helper()
	res, err := parse(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var w strings.Builder
	write(&w, res, nil, "scripts/bench.sh", raw)
	return w.String()
}

// row returns the first line of the report that starts with prefix, after
// the line that starts with after (if after is not empty).
func row(t *testing.T, report, after, prefix string) string {
	t.Helper()
	seen := after == ""
	for line := range strings.Lines(report) {
		if seen && strings.HasPrefix(line, prefix) {
			return line
		}
		seen = seen || strings.HasPrefix(line, after)
	}
	t.Fatalf("no line starting with %q after %q in the report", prefix, after)
	return ""
}

// TestStepsTargets: the targets against the fenced floors and the
// sequence mode's floor, and the step-by-step tables, come out of one raw
// run with the figures computed from it.
func TestStepsTargets(t *testing.T) {
	raw := stepsRaw()
	report := renderRaw(t, raw)

	for _, c := range []struct {
		after, prefix string
		want          []string
	}{
		// 5571 / 6249
		{"", "| Redis: dlock uncontended ops/s ≥ 0.95× its fenced floor", []string{"| 0.89× |", "**missed** by 6%", "18.1 µs", "16.2 µs", "dlock is at 0.91× the fenced floor"}},
		// 86000 / 94000; what each step adds by p50 over the line above.
		{"", "| Redis, step by step: dlock ≥ 0.95× its fenced floor by p50", []string{"| 0.91× |", "**missed** by 4%", "scripts +3.0 µs", "driver +1.0 µs", "dlock +4.0 µs", "leaves dlock 4.5 µs", "takes 8.0 µs"}},
		// 2121 / 2551; the fenced floor 400000 / 420000 by p50.
		{"", "| ZooKeeper: dlock uncontended ops/s ≥ 0.95× the raw floor", []string{"| 0.83× |", "**missed** by 12%", "not the right reference", "fenced floor at 0.95×", "seq-floor) at 0.99×"}},
		// 420000 / 436000
		{"", "| ZooKeeper, step by step: dlock ≥ 0.95× the fenced floor by p50", []string{"| 0.96× |", "| met |"}},
		{"", "| (for information) ZooKeeper, step by step: the fenced floor / the floor by p50", []string{"| 0.95× |", "not the right reference"}},
		// 3500 / 4200; by p50 246000 / 300000 here, 246000 / 255000 in the steps.
		{"", "| MySQL (MariaDB), tokens=sequence: dlock uncontended ops/s ≥ 0.85× the raw GET_LOCK floor", []string{"| 0.83× |", "**missed** by 2%", "0.82× the floor by p50", "0.96× by p50"}},
		// 246000 / 255000
		{"", "| MySQL (MariaDB), tokens=sequence, step by step: dlock ≥ 0.85× the floor by p50", []string{"| 0.96× |", "| met |"}},
		// 246000 / 260000
		{"", "| (for information) MySQL (MariaDB), tokens=sequence, step by step: the driver's SQL alone", []string{"| 0.95× |"}},
		// The step tables: in step order, p50 against the floor, the
		// reference and the line above.
		{"### Redis, uncontended, step by step (runs: 1)", "| dlock | ", []string{"94 µs", "| 0.85× |", "| 0.91× |", "| 0.96× |", "+4.0 µs"}},
		{"### ZooKeeper, uncontended, step by step (runs: 1)", "| seq-floor | ", []string{"405 µs", "| 0.99× |"}},
		{"### MySQL (MariaDB), tokens=sequence, step by step (runs: 1)", "| sql+pool | ", []string{"262 µs", "| 0.94× |", "+2.0 µs"}},
	} {
		line := row(t, report, c.after, c.prefix)
		for _, s := range c.want {
			if !strings.Contains(line, s) {
				t.Errorf("%q: want %q in\n%s", c.prefix, s, line)
			}
		}
	}
	if strings.Contains(report, "(for information) Redis: dlock / the fenced floor") {
		t.Error("Redis: dlock / the fenced floor is still a row for information, not a target")
	}
}

// TestKubernetesSection: BenchmarkK8s's uncontended rows get a table, its
// requests a table of their own (it has no held cycles), and a target row
// against the floor.
func TestKubernetesSection(t *testing.T) {
	raw := "goos: linux\n" +
		uncontendedLine("K8s/Uncontended", map[string]float64{"dlock": 10_000_000, "floor": 8_000_000}) +
		"BenchmarkK8s/Requests-2 \t 1\t 1000000 ns/op\t 3.05 dlock.reqs/cycle\t 2.00 floor.reqs/cycle\n"
	report := renderRaw(t, raw)
	if r := row(t, report, "### Kubernetes", "| dlock |"); !strings.Contains(r, "0.80×") {
		t.Errorf("Kubernetes dlock row %q, want 0.80× of the floor", r)
	}
	if r := row(t, report, "### Kubernetes", "| implementation | requests per cycle |"); r == "" {
		t.Error("no requests table")
	}
	if r := row(t, report, "### Kubernetes", "| dlock | 3.05 |"); r == "" {
		t.Error("no dlock requests row")
	}
	if r := row(t, report, "", "| Kubernetes: dlock uncontended ops/s"); !strings.Contains(r, "missed") || !strings.Contains(r, "three API requests") {
		t.Errorf("Kubernetes target row %q, want missed, with why", r)
	}
}
