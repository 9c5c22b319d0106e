package main

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/dlock-go/dlock/conformance"
)

// The markers around the generated summary in README.md.
const (
	summaryBegin = "<!-- safety-summary:begin -->"
	summaryEnd   = "<!-- safety-summary:end -->"
)

// summary renders the README grid: one row per deployment, one column per
// fault that any deployment ran, each cell the claimed outcome(s) in short
// words, marked FAILED when a trial fell outside it; and the soak's status.
// It holds claims and verdicts only, never measurements, so it is the same
// for every passing run.
func summary(recs []conformance.Record) string {
	cells := map[[2]string]conformance.Record{}
	soaks := map[string]string{}
	var deps []string
	used := map[string]bool{}
	for _, r := range recs {
		if r.Kind != "fault" && r.Kind != "soak" {
			continue // the grid holds lock cells only
		}
		if !slices.Contains(deps, r.Deployment) {
			deps = append(deps, r.Deployment)
		}
		if r.Kind == "soak" {
			if soaks[r.Deployment] != "FAILED" {
				soaks[r.Deployment] = status(r)
			}
			continue
		}
		k := [2]string{r.Deployment, r.Fault}
		if old, ok := cells[k]; ok {
			r = merge([]conformance.Record{old, r})
		}
		cells[k] = r
		used[r.Fault] = true
	}
	sort.Strings(deps)
	var faults []string
	for _, f := range conformance.AllFaults() {
		if used[string(f)] {
			faults = append(faults, string(f))
		}
	}
	var b bytes.Buffer
	b.WriteString("| deployment | " + strings.Join(faults, " | ") + " | soak |\n")
	b.WriteString("|---" + strings.Repeat("|---", len(faults)) + "|---|\n")
	for _, d := range deps {
		row := []string{d}
		for _, f := range faults {
			r, ok := cells[[2]string{d, f}]
			row = append(row, shortCell(r, ok))
		}
		soak := soaks[d]
		if soak == "" {
			soak = "–"
		}
		row = append(row, soak)
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}

// shortCell names a cell's claim in short words: held, detected, fenced,
// UNSAFE, joined by " / "; "–" for a fault the deployment does not take.
func shortCell(r conformance.Record, ok bool) string {
	switch {
	case !ok:
		return "–"
	case r.Skip != "" && !r.Failed:
		return "skipped"
	}
	short := map[string]string{"held": "held", "loss-detected": "detected", "safe-with-fencing": "fenced", "UNSAFE": "UNSAFE"}
	var parts []string
	for _, o := range strings.Split(r.Expected, "|") {
		if w, ok := short[o]; ok {
			parts = append(parts, w)
		}
	}
	c := strings.Join(parts, " / ")
	if c == "" {
		c = "–"
	}
	if r.Failed {
		c = "**FAILED** (" + c + ")"
	}
	return c
}

// spliceSummary replaces what lies between the summary markers in text.
func spliceSummary(text, sum string) (string, error) {
	i := strings.Index(text, summaryBegin)
	j := strings.Index(text, summaryEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %s … %s block", summaryBegin, summaryEnd)
	}
	return text[:i+len(summaryBegin)] + "\n" + sum + text[j:], nil
}

// summaryCells reads the summary grid in text into its cells, keyed by
// deployment and column, leaving out the deployments in drop and the cells
// "–" (a fault the deployment does not take), so that dropping a row whose
// column no other row uses changes nothing else.
func summaryCells(text string, drop map[string]bool) map[string]string {
	i, j := strings.Index(text, summaryBegin), strings.Index(text, summaryEnd)
	if i < 0 || j < i {
		return nil
	}
	cells := map[string]string{}
	var header []string
	for _, l := range strings.Split(text[i+len(summaryBegin):j], "\n") {
		cols := splitRow(l)
		switch {
		case !strings.HasPrefix(l, "| ") || len(cols) == 0 || strings.HasPrefix(l, "|---"):
		case cols[0] == "deployment":
			header = cols
		case !drop[cols[0]]:
			cells[cols[0]] = "row"
			for k := 1; k < len(cols) && k < len(header); k++ {
				if cols[k] != "–" {
					cells[cols[0]+" "+header[k]] = cols[k]
				}
			}
		}
	}
	return cells
}
