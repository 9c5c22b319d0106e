package main

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conformance"
)

// guardsHeading opens the report's section of guard outcomes, its last.
const guardsHeading = "## Guards"

// guardColumns names the guard suite's cases (conformance.GuardCases) in the
// Guards table's header.
var guardColumns = map[string]string{
	"StaleRejectedEqualAccepted": "stale rejected, equal accepted",
	"RejectedChangesNothing":     "rejected write changes nothing",
	"Atomic":                     "atomic (8 writers, porcupine)",
	"SurvivesRestart":            "survives restart",
	"PausedHolder":               "paused holder refused",
}

// renderGuards writes the Guards section from the guard records of recs: one
// row per guard and server, one column per case of the suite (then any
// other case recorded), each cell the case's status; "" if there are none.
func renderGuards(recs []conformance.Record, mach string, now time.Time) string {
	type rowKey struct{ guard, server string }
	cells := map[rowKey]map[string][]conformance.Record{}
	var rows []rowKey
	cases := conformance.GuardCases()
	for _, r := range recs {
		if r.Kind != "guard" {
			continue
		}
		k := rowKey{r.Guard, r.Deployment}
		if cells[k] == nil {
			cells[k] = map[string][]conformance.Record{}
			rows = append(rows, k)
		}
		cells[k][r.Case] = append(cells[k][r.Case], r)
		if !slices.Contains(cases, r.Case) {
			cases = append(cases, r.Case)
		}
	}
	if len(rows) == 0 {
		return ""
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].guard != rows[j].guard {
			return rows[i].guard < rows[j].guard
		}
		return rows[i].server < rows[j].server
	})
	var b bytes.Buffer
	b.WriteString(guardsHeading + "\n\n")
	fmt.Fprintf(&b, "From the run of %s, on %s.\n\n", now.Format("2006-01-02 15:04 MST"), mach)
	b.WriteString(`Each row is one guard (package fencing and its subpackages; see docs/guards.md) on a real
server, run through the guard suite (conformance.RunGuardSuite). Its cases: a token equal to
the highest accepted is accepted and a lower one rejected, naming both; a rejected write
changes neither the value nor the fence, as another client sees them; 8 clients writing one
resource with random tokens, each reading after each write, give a history that porcupine
finds linearizable against a guard whose check and write are one step; the value and the
fence survive a crash and restart of the server (skipped where the resource keeps nothing);
a lock holder in a child process, stopped (SIGSTOP) past its lease's TTL, has its write
rejected once resumed, after a contender took the lock and wrote, and the contender's value
stays. -check compares every cell.

`)
	header := []string{"guard", "server"}
	for _, c := range cases {
		if l, ok := guardColumns[c]; ok {
			c = l
		}
		header = append(header, c)
	}
	b.WriteString("| " + strings.Join(header, " | ") + " |\n")
	b.WriteString(strings.Repeat("|---", len(header)) + "|\n")
	for _, k := range rows {
		server := k.server
		if server == "" {
			server = "–"
		}
		row := []string{cell(k.guard), cell(server)}
		for _, c := range cases {
			rs := cells[k][c]
			if len(rs) == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, cell(status(merge(rs))))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}

// splitGuards splits a report into the Guards section (from its heading to
// the next "## " heading or the end) and the rest, before and after it.
func splitGuards(report string) (before, guards, after string) {
	i := strings.Index(report, "\n"+guardsHeading+"\n")
	if i < 0 {
		return report, "", ""
	}
	before, rest := report[:i+1], report[i+1:]
	if j := strings.Index(rest[len(guardsHeading):], "\n## "); j >= 0 {
		j += len(guardsHeading) + 1
		return before, rest[:j], rest[j:]
	}
	return before, rest, ""
}

// spliceGuards returns report with its Guards section replaced by guards
// (appended, after a blank line, if it has none; removed if guards is "").
func spliceGuards(report, guards string) string {
	before, old, after := splitGuards(report)
	if old == "" {
		before = strings.TrimRight(before, "\n") + "\n"
		if guards == "" {
			return before
		}
		return before + "\n" + guards
	}
	if guards != "" && after != "" {
		guards += "\n"
	}
	return before + guards + after
}

// isGuardClaim says whether a claims key (claims) is a Guards cell.
func isGuardClaim(k string) bool { return strings.HasPrefix(k, "guard ") }
