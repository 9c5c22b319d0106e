package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conformance"
)

// guardRecords are the records of two guards: one on a durable server, one
// whose restart case is skipped.
func guardRecords() []conformance.Record {
	var recs []conformance.Record
	for _, g := range []struct{ guard, server, skip string }{{"redis-set", "redis", ""}, {"http-header", "net/http service", "not durable: in memory"}} {
		for _, c := range conformance.GuardCases() {
			r := conformance.Record{Kind: "guard", Deployment: g.server, Guard: g.guard, Case: c, Trials: 1,
				LatencyP50Ms: -1, LatencyMaxMs: -1, Time: "2026-11-28T18:00:00Z"}
			if c == "SurvivesRestart" {
				r.Skip = g.skip
			}
			recs = append(recs, r)
		}
	}
	return recs
}

func TestGuardsTable(t *testing.T) {
	r := render(append(testRecords(), guardRecords()...), "test machine", time.Date(2026, 11, 28, 18, 0, 0, 0, time.UTC))
	want := []string{
		"| guard | server | stale rejected, equal accepted | rejected write changes nothing | atomic (8 writers, porcupine) | survives restart | paused holder refused |",
		"| http-header | net/http service | pass | pass | pass | skipped: not durable: in memory | pass |",
		"| redis-set | redis | pass | pass | pass | pass | pass |",
	}
	for _, w := range want {
		if !strings.Contains(r, w) {
			t.Errorf("report lacks %q:\n%s", w, r)
		}
	}
	if strings.Index(r, "## Soak") > strings.Index(r, guardsHeading) || strings.Index(r, "| http-header") > strings.Index(r, "| redis-set") {
		t.Errorf("Guards not last, or its rows not by guard:\n%s", r)
	}
	c := claims(r)
	if got := c["guard http-header on net/http service: survives restart"]; got != "skipped: not durable: in memory" {
		t.Errorf("claim of the skipped cell = %q", got)
	}
	if got := c["fault redis stall"]; got != "expected loss-detected, pass" {
		t.Errorf("the lock cells' claims change beside guards: %q", got)
	}
	if strings.Contains(summary(append(testRecords(), guardRecords()...)), "redis-set") {
		t.Error("guard records in the README's grid of lock cells")
	}
	if noGuards := render(testRecords(), "test machine", time.Date(2026, 11, 28, 18, 0, 0, 0, time.UTC)); !strings.HasPrefix(r, noGuards) {
		t.Error("the lock sections render differently when guard records are present")
	}
}

// A guard record that disagrees with the committed report, or a committed
// guard cell the results lack, fails -check, as lock cells do.
func TestCheckGuardCells(t *testing.T) {
	committed := claims(render(append(testRecords(), guardRecords()...), "one", time.Now()))
	for name, change := range map[string]func([]conformance.Record) []conformance.Record{
		"failed":       func(rs []conformance.Record) []conformance.Record { rs[2].Failed = true; return rs },
		"skipped":      func(rs []conformance.Record) []conformance.Record { rs[1].Skip = "no server"; return rs },
		"now durable":  func(rs []conformance.Record) []conformance.Record { rs[8].Skip = ""; return rs },
		"missing cell": func(rs []conformance.Record) []conformance.Record { return rs[1:] },
		"other server": func(rs []conformance.Record) []conformance.Record { rs[0].Deployment = "valkey"; return rs },
	} {
		recs := append(testRecords(), change(guardRecords())...)
		d := compareClaims(committed, claims(render(recs, "other", time.Now())))
		if len(d) == 0 || !strings.Contains(strings.Join(d, "\n"), "guard ") {
			t.Errorf("%s: compareClaims = %q, want a guard cell's difference", name, d)
		}
	}
	if d := compareClaims(committed, claims(render(append(testRecords(), guardRecords()...), "other", time.Now()))); len(d) != 0 {
		t.Errorf("another run with the same outcomes: %q", d)
	}
}

func writeRecords(t *testing.T, recs []conformance.Record) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	for _, r := range recs {
		j, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(j, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "1.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// -only guards writes the Guards section from a guard-only run and keeps the
// lock sections byte for byte; -check -only guards compares the Guards cells
// only, and fails on a guard cell that differs; -check -only locks compares
// the lock cells only. A plain -check of a guard-only run fails: its lock
// rows are missing.
func TestOnlyGuards(t *testing.T) {
	tmp := t.TempDir()
	out, readme := filepath.Join(tmp, "SAFETY.md"), filepath.Join(tmp, "README.md")
	lockDir, guardDir := writeRecords(t, testRecords()), writeRecords(t, guardRecords())
	if err := os.WriteFile(readme, []byte(summaryBegin+"\n"+summaryEnd+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runOK := func(args ...string) {
		t.Helper()
		if err := run(append([]string{"-o", out, "-readme", readme}, args...), os.Stderr, os.Stderr); err != nil {
			t.Fatalf("safety-report %s: %v", strings.Join(args, " "), err)
		}
	}
	runOK("-from", lockDir) // the lock sections, no Guards yet
	locks, _ := os.ReadFile(out)
	readmeBefore, _ := os.ReadFile(readme)
	runOK("-from", guardDir, "-only", "guards")
	withGuards, _ := os.ReadFile(out)
	if before, guards, _ := splitGuards(string(withGuards)); before != string(locks)+"\n" || !strings.Contains(guards, "| redis-set | redis | pass |") {
		t.Fatalf("-only guards changed the lock sections or wrote no guards:\n%s", withGuards)
	}
	if r, _ := os.ReadFile(readme); string(r) != string(readmeBefore) {
		t.Error("-only guards changed the README")
	}
	runOK("-from", guardDir, "-only", "guards") // idempotent
	if again, _ := os.ReadFile(out); string(again) != string(withGuards) {
		t.Errorf("a second -only guards changed the file:\n%s", again)
	}
	runOK("-from", guardDir, "-only", "guards", "-check")
	runOK("-from", lockDir, "-only", "locks", "-check")
	runOK("-from", writeRecords(t, append(testRecords(), guardRecords()...)), "-check")

	bad := guardRecords()
	bad[3].Failed = true // redis-set SurvivesRestart
	var d *diffError
	err := run([]string{"-o", out, "-readme", readme, "-from", writeRecords(t, bad), "-only", "guards", "-check"}, os.Stderr, os.Stderr)
	if !errors.As(err, &d) || !strings.Contains(err.Error(), "guard redis-set on redis: survives restart") {
		t.Errorf("-check -only guards with a failed guard cell = %v, want its difference", err)
	}
	err = run([]string{"-o", out, "-readme", readme, "-from", guardDir, "-check"}, os.Stderr, os.Stderr)
	if !errors.As(err, &d) || !strings.Contains(err.Error(), "not in the results") {
		t.Errorf("-check of a guard-only run = %v, want the missing lock rows", err)
	}
	if after, _ := os.ReadFile(out); string(after) != string(withGuards) {
		t.Error("-check wrote the file")
	}
}

// -check -not-run DEP leaves DEP's committed rows (in the report and in the
// README's grid) uncompared when the run has no results for it; without the
// flag they are missing, and a run that has results for DEP is refused.
func TestCheckNotRun(t *testing.T) {
	tmp := t.TempDir()
	out, readme := filepath.Join(tmp, "SAFETY.md"), filepath.Join(tmp, "README.md")
	if err := os.WriteFile(readme, []byte(summaryBegin+"\n"+summaryEnd+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	all := writeRecords(t, testRecords())
	if err := run([]string{"-o", out, "-readme", readme, "-from", all}, os.Stderr, os.Stderr); err != nil {
		t.Fatal(err)
	}
	var withoutEtcd []conformance.Record
	for _, r := range testRecords() {
		if r.Deployment != "etcd-3" {
			withoutEtcd = append(withoutEtcd, r)
		}
	}
	partial := writeRecords(t, withoutEtcd)
	check := func(extra ...string) error {
		return run(append([]string{"-o", out, "-readme", readme, "-check"}, extra...), io.Discard, io.Discard)
	}
	var d *diffError
	if err := check("-from", partial); !errors.As(err, &d) || !strings.Contains(err.Error(), "fault etcd-3 kill-leader") || !strings.Contains(err.Error(), "README.md") {
		t.Errorf("-check of a run without etcd-3 = %v, want its rows missing from the report and the README", err)
	}
	if err := check("-from", partial, "-not-run", "etcd-3"); err != nil {
		t.Errorf("-check -not-run etcd-3 of a run without etcd-3 = %v, want a match", err)
	}
	if err := check("-from", all, "-not-run", "etcd-3"); err == nil || !strings.Contains(err.Error(), "have rows for it") {
		t.Errorf("-check -not-run etcd-3 of a run with etcd-3 = %v, want it refused", err)
	}
	bad := slices.Clone(withoutEtcd)
	bad[0].Failed = true
	if err := check("-from", writeRecords(t, bad), "-not-run", "etcd-3"); !errors.As(err, &d) {
		t.Errorf("-check -not-run etcd-3 with a failed redis cell = %v, want its difference", err)
	}
	if err := run([]string{"-o", out, "-readme", readme, "-from", partial, "-not-run", "etcd-3"}, io.Discard, io.Discard); err == nil {
		t.Error("-not-run without -check wrote a report")
	}
}
