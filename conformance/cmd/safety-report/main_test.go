package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conformance"
)

func testRecords() []conformance.Record {
	return []conformance.Record{
		{Kind: "fault", Deployment: "redis", Fault: "stall", Expected: "loss-detected", Observed: "loss-detected", Trials: 1, LatencyP50Ms: 700, LatencyMaxMs: 700, Why: "deadline"},
		{Kind: "fault", Deployment: "redis", Fault: "partition", Expected: "loss-detected|safe-with-fencing", Observed: "safe-with-fencing", Trials: 1, LatencyP50Ms: 800, LatencyMaxMs: 800},
		{Kind: "fault", Deployment: "redis", Fault: "partition", Expected: "loss-detected|safe-with-fencing", Observed: "loss-detected", Trials: 2, LatencyP50Ms: 600, LatencyMaxMs: 900},
		{Kind: "fault", Deployment: "etcd-3", Fault: "kill-leader", Skip: "no leader", LatencyP50Ms: -1, LatencyMaxMs: -1},
		{Kind: "soak", Deployment: "redis", Fault: "stall", Trials: 4, Ops: 100, Duration: "45s", Observed: "3 processes × 4 lockers, 4 keys", LatencyP50Ms: -1, LatencyMaxMs: -1},
	}
}

func TestRenderMergesAndOrders(t *testing.T) {
	r := render(testRecords(), "test machine", time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC))
	want := []string{
		"| etcd-3 | kill-leader | – | skipped: no leader |",
		"| redis | partition | loss-detected\\|safe-with-fencing | pass | loss-detected\\|safe-with-fencing | 3 | 600 ms / 900 ms | 0 |",
		"| redis | stall | loss-detected | pass | loss-detected | 1 | 700 ms / 700 ms | 0 | deadline |",
		"| redis | pass | 45s | 3 processes × 4 lockers, 4 keys | 4 (stall) | 0 | 100 | 0 |",
		"on 2026-11-22 05:00 UTC, on test machine",
	}
	for _, w := range want {
		if !strings.Contains(r, w) {
			t.Errorf("report lacks %q:\n%s", w, r)
		}
	}
	if strings.Index(r, "| redis | partition") > strings.Index(r, "| redis | stall") {
		t.Error("faults not in the suite's order")
	}
}

// A results directory reused across runs must not let an earlier run's pass
// hide this run's skip (nor an earlier skip hide this run's pass).
func TestMergeNewestRecordDecidesSkip(t *testing.T) {
	pass := conformance.Record{Kind: "fault", Deployment: "etcd-3", Fault: "kill-leader", Expected: "held", Observed: "held", Trials: 1, Time: "2026-11-22T05:00:00Z"}
	skip := conformance.Record{Kind: "fault", Deployment: "etcd-3", Fault: "kill-leader", Expected: "held", Skip: "etcd binary missing", Time: "2026-11-23T05:00:00Z"}
	for _, order := range [][]conformance.Record{{pass, skip}, {skip, pass}} {
		if m := merge(order); m.Skip != skip.Skip {
			t.Errorf("merge(%s first) = skip %q, want this run's skip %q", order[0].Time, m.Skip, skip.Skip)
		}
	}
	skip.Time, pass.Time = pass.Time, skip.Time // now the pass is the newer
	if m := merge([]conformance.Record{skip, pass}); m.Skip != "" {
		t.Errorf("an old skip hides the newer pass: skip %q", m.Skip)
	}
}

func TestCheckComparesClaimsOnly(t *testing.T) {
	recs := testRecords()
	committed := render(recs, "one machine", time.Now())
	// Another run: other observed outcome within the set, other latencies, another machine.
	recs[1].Observed, recs[1].LatencyP50Ms = "loss-detected", 1
	if d := compareClaims(claims(committed), claims(render(recs, "other", time.Now()))); len(d) != 0 {
		t.Fatalf("differences in what -check must ignore: %v", d)
	}
	recs[0].Failed = true
	recs[3].Skip = ""
	recs[3].Expected = "loss-detected"
	d := compareClaims(claims(committed), claims(render(recs, "other", time.Now())))
	if len(d) != 2 || !strings.Contains(d[0], "etcd-3 kill-leader") || !strings.Contains(d[1], "FAILED") {
		t.Fatalf("compareClaims = %q, want the changed etcd-3 row and the failed redis row", d)
	}
}

func TestSummaryGrid(t *testing.T) {
	sum := summary(testRecords())
	want := []string{
		"| deployment | partition | stall | kill-leader | soak |",
		"| etcd-3 | – | – | skipped | – |",
		"| redis | detected / fenced | detected | – | pass |",
	}
	for _, w := range want {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}
	recs := testRecords()
	recs[0].Failed = true
	if s := summary(recs); !strings.Contains(s, "| redis | detected / fenced | **FAILED** (detected) |") {
		t.Errorf("a failed cell is not marked:\n%s", s)
	}
	readme := "intro\n" + summaryBegin + "\nold grid\n" + summaryEnd + "\nrest\n"
	got, err := spliceSummary(readme, sum)
	if err != nil {
		t.Fatal(err)
	}
	if got != "intro\n"+summaryBegin+"\n"+sum+summaryEnd+"\nrest\n" {
		t.Errorf("spliceSummary = %q", got)
	}
	if again, _ := spliceSummary(got, sum); again != got {
		t.Error("spliceSummary is not idempotent")
	}
	if _, err := spliceSummary("no markers", sum); err == nil {
		t.Error("spliceSummary without markers: no error")
	}
}

// The crowd cells are rows of their own, in the suite's order (each after
// the cells of its primitive that it follows), columns of the summary, and
// claims that -check compares.
func TestCrowdCells(t *testing.T) {
	rec := func(f string) conformance.Record {
		return conformance.Record{Kind: "fault", Deployment: "redis", Fault: f, Expected: "loss-detected", Observed: "loss-detected",
			Trials: 1, LatencyP50Ms: 700, LatencyMaxMs: 700, Why: "as partition, for " + f}
	}
	var recs []conformance.Record
	for _, f := range []string{"rw-reader-partition", "semaphore-3-partition", "rw-pause", "semaphore-pause", "restart-empty", "partition"} {
		recs = append(recs, rec(f))
	}
	r := render(recs, "test machine", time.Now())
	order := []string{"| redis | partition |", "| redis | semaphore-pause |", "| redis | semaphore-3-partition |",
		"| redis | rw-pause |", "| redis | rw-reader-partition |", "| redis | restart-empty |"}
	last := -1
	for _, row := range order {
		i := strings.Index(r, row)
		if i < 0 || i < last {
			t.Fatalf("row %q missing or out of the suite's order:\n%s", row, r)
		}
		last = i
	}
	c := claims(r)
	for _, f := range []string{"semaphore-3-partition", "rw-reader-partition"} {
		if got := c["fault redis "+f]; got != "expected loss-detected, pass" {
			t.Errorf("claim of %s = %q", f, got)
		}
	}
	if sum := summary(recs); !strings.Contains(sum, "| deployment | partition | semaphore-pause | semaphore-3-partition | rw-pause | rw-reader-partition | restart-empty | soak |") {
		t.Errorf("summary columns:\n%s", sum)
	}
	recs[0].Failed = true
	if d := compareClaims(c, claims(render(recs, "other", time.Now()))); len(d) != 1 || !strings.Contains(d[0], "rw-reader-partition") {
		t.Errorf("compareClaims = %q, want the failed rw-reader-partition row", d)
	}
}

// Without -from the tests run in every module with a fault matrix, a soak
// or a guard suite: the root and the nested etcd, fencing/s3fence and nats modules.
func TestFaultModules(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	mods, err := faultModules(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{root, filepath.Join(root, "etcd"), filepath.Join(root, "fencing", "s3fence"), filepath.Join(root, "k8s"), filepath.Join(root, "nats")}; !slices.Equal(mods, want) {
		t.Fatalf("faultModules = %q, want %q", mods, want)
	}
}
