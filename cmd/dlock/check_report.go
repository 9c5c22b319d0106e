package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// checkReportJSON is dlock check's report for machines (-o json, --out
// FILE.json); checkUsage documents it.
type checkReportJSON struct {
	Dlock       string           `json:"dlock"`
	Started     string           `json:"started"`
	Seconds     float64          `json:"seconds"`
	Deployments []deploymentJSON `json:"deployments"`
}

type deploymentJSON struct {
	DSN          string            `json:"dsn"`
	Result       string            `json:"result"`
	Error        string            `json:"error,omitempty"`
	TimedOutIn   string            `json:"timed_out_in,omitempty"`
	Seconds      float64           `json:"seconds"`
	Capabilities *capabilitiesJSON `json:"capabilities,omitempty"`
	Latency      *latencyJSON      `json:"latency,omitempty"`
	Tests        []testJSON        `json:"tests"`
	Cleanup      string            `json:"cleanup,omitempty"`
	LeftBehind   []string          `json:"left_behind,omitempty"`
}

type capabilitiesJSON struct {
	Token           string `json:"token"`
	Fencing         string `json:"fencing"`
	FIFO            bool   `json:"fifo"`
	FaultTolerant   bool   `json:"fault_tolerant"`
	LossSignal      string `json:"loss_signal"`
	TimeAuthority   string `json:"time_authority"`
	PushWait        bool   `json:"push_wait"`
	Shared          bool   `json:"shared"`
	NativeSemaphore bool   `json:"native_semaphore"`
}

type latencyJSON struct {
	AcquireP50 float64 `json:"acquire_p50_ms,omitempty"`
	AcquireP99 float64 `json:"acquire_p99_ms,omitempty"`
	HandoffP50 float64 `json:"handoff_p50_ms,omitempty"`
	HandoffP99 float64 `json:"handoff_p99_ms,omitempty"`
	Error      string  `json:"error,omitempty"`
}

type testJSON struct {
	Name    string  `json:"name"`
	Status  string  `json:"status"`
	Reason  string  `json:"reason,omitempty"`
	Seconds float64 `json:"seconds"`
}

// tokenKind says where a backend's fencing tokens come from.
func tokenKind(u string) string {
	pu, err := backend.ParseDSN(u)
	if err != nil {
		return "-"
	}
	switch pu.Scheme {
	case "redis", "rediss", "redis+sentinel", "redis+cluster":
		return "per-key counter"
	case "redlock", "redlocks":
		return "max of node counters"
	case "etcd", "etcds":
		return "create revision"
	case "zk":
		return "czxid"
	case "postgres", "postgresql":
		if pu.Query().Get("tokens") == "sequence" {
			return "sequence and epoch"
		}
		return "per-key counter row"
	case "mysql":
		return "per-key counter row"
	case "pgtable", "mysqltable":
		return "per-row counter"
	case "mem":
		return "per-key counter"
	}
	return "-"
}

func lossSignal(c backend.Capabilities) string {
	if c.LossNotify {
		return "immediate"
	}
	return "at renewal"
}

// result is the deployment's outcome in one word.
func (d *deployment) result() string {
	switch {
	case d.openErr != nil:
		return "unreachable"
	case d.crash != nil && d.crash.timedOut:
		return "timed-out"
	case d.crash != nil && strings.HasPrefix(d.crash.reason, "interrupted"):
		return "interrupted"
	case d.failed() > 0:
		return "fail"
	case d.results == nil:
		return "not run" // interrupted before its turn
	}
	return "pass"
}

// tests returns the deployment's test results in order, the test a crash
// or timeout stopped included, without the suite's own.
func (d *deployment) tests() []testJSON {
	var out []testJSON
	for _, r := range d.results {
		if r.Name == "" {
			if r.Status == "FAIL" && d.crash == nil && !hasFailedTest(d.results) {
				out = append(out, testJSON{Name: "(setup)", Status: "fail", Reason: r.note(), Seconds: r.Elapsed.Seconds()})
			}
			continue
		}
		out = append(out, testJSON{Name: r.Name, Status: strings.ToLower(r.Status), Reason: r.note(), Seconds: r.Elapsed.Seconds()})
	}
	if d.crash != nil {
		name := d.crash.test
		if name == "" {
			name = "(suite)"
		}
		out = append(out, testJSON{Name: name, Status: "fail", Reason: d.crash.reason})
	}
	return out
}

func hasFailedTest(results []testResult) bool {
	for _, r := range results {
		if r.Name != "" && r.Status == "FAIL" {
			return true
		}
	}
	return false
}

func newCheckReport(started time.Time, deps []*deployment) checkReportJSON {
	rep := checkReportJSON{Dlock: version(), Started: started.UTC().Format(time.RFC3339), Seconds: time.Since(started).Seconds()}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, d := range deps {
		j := deploymentJSON{DSN: d.plan.shown, Result: d.result(), Seconds: d.elapsed.Seconds(), Tests: d.tests(), Cleanup: d.cleanup, LeftBehind: d.left}
		if j.Tests == nil {
			j.Tests = []testJSON{}
		}
		switch {
		case d.openErr != nil:
			j.Error = d.openStep + ": " + errText(d.openErr)
		case d.crash != nil && d.crash.timedOut:
			j.TimedOutIn = d.crash.where()
		case d.crash != nil:
			j.Error = d.crash.reason
		}
		if d.openErr == nil {
			c := d.caps
			j.Capabilities = &capabilitiesJSON{Token: tokenKind(d.plan.user), Fencing: c.Fencing.String(), FIFO: c.FIFO, FaultTolerant: c.FaultTolerant,
				LossSignal: lossSignal(c), TimeAuthority: c.TimeAuthority.String(), PushWait: c.PushWait, Shared: c.Shared, NativeSemaphore: c.NativeSemaphore}
			if l := d.latency; l.Err != nil || l.AcquireP50 > 0 {
				j.Latency = &latencyJSON{AcquireP50: ms(l.AcquireP50), AcquireP99: ms(l.AcquireP99), HandoffP50: ms(l.HandoffP50), HandoffP99: ms(l.HandoffP99)}
				if l.Err != nil {
					j.Latency.Error = errText(l.Err)
				}
			}
		}
		rep.Deployments = append(rep.Deployments, j)
	}
	return rep
}

// checkReportFormat returns the format of a report file, from its
// extension: "html" or "json".
func checkReportFormat(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".html", ".htm":
		return "html", nil
	case ".json":
		return "json", nil
	default:
		return "", fmt.Errorf("cannot tell the format of %q: name it .html or .json", path)
	}
}

// writeCheckReport writes the report to path, as HTML or JSON.
func writeCheckReport(path string, rep checkReportJSON, deps []*deployment) error {
	format, err := checkReportFormat(path)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if format == "json" {
		j, _ := json.MarshalIndent(rep, "", "  ")
		b.Write(append(j, '\n'))
	} else if err := writeCheckHTML(&b, rep, deps); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// comparisonTable is the table of several deployments: rows of cells under
// a header, in sections, with footnotes for the reasons of skips and
// failures.
type comparisonTable struct {
	columns  []string // the deployments, redacted
	sections []tableSection
	notes    []string // footnote n is notes[n-1]
}

type tableSection struct {
	head string // "CAPABILITY", "LATENCY", "TEST"
	rows []tableRow
}

type tableRow struct {
	name  string
	cells []tableCell
}

type tableCell struct {
	text   string
	status string // "pass", "fail", "skip" for test results; "" otherwise
	note   int    // footnote number, 0 if none
}

func (c tableCell) String() string {
	if c.note > 0 {
		return fmt.Sprintf("%s [%d]", c.text, c.note)
	}
	return c.text
}

// buildComparison lays out the deployments' report as one table.
func buildComparison(rep checkReportJSON, deps []*deployment) comparisonTable {
	var t comparisonTable
	noteOf := map[string]int{}
	note := func(s string) int {
		if s == "" {
			return 0
		}
		if n, ok := noteOf[s]; ok {
			return n
		}
		t.notes = append(t.notes, s)
		noteOf[s] = len(t.notes)
		return len(t.notes)
	}
	for _, d := range rep.Deployments {
		t.columns = append(t.columns, d.DSN)
	}
	yesNo := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	capRow := func(name string, f func(*capabilitiesJSON) string) tableRow {
		r := tableRow{name: name}
		for _, d := range rep.Deployments {
			c := tableCell{text: "-"}
			if d.Capabilities != nil {
				c.text = f(d.Capabilities)
			} else {
				c.note = note(d.Error)
			}
			r.cells = append(r.cells, c)
		}
		return r
	}
	t.sections = append(t.sections, tableSection{head: "CAPABILITY", rows: []tableRow{
		capRow("token", func(c *capabilitiesJSON) string { return c.Token }),
		capRow("fencing", func(c *capabilitiesJSON) string { return c.Fencing }),
		capRow("fifo", func(c *capabilitiesJSON) string { return yesNo(c.FIFO) }),
		capRow("fault-tolerant", func(c *capabilitiesJSON) string { return yesNo(c.FaultTolerant) }),
		capRow("loss-signal", func(c *capabilitiesJSON) string { return c.LossSignal }),
	}})
	latRow := func(name string, f func(checkLatency) time.Duration) tableRow {
		r := tableRow{name: name}
		for _, d := range deps {
			c := tableCell{text: formatDuration(f(d.latency))}
			if d.latency.Err != nil {
				c.note = note("latency not measured: " + errText(d.latency.Err))
			}
			r.cells = append(r.cells, c)
		}
		return r
	}
	t.sections = append(t.sections, tableSection{head: "LATENCY", rows: []tableRow{
		latRow("acquire p50", func(l checkLatency) time.Duration { return l.AcquireP50 }),
		latRow("acquire p99", func(l checkLatency) time.Duration { return l.AcquireP99 }),
		latRow("hand-off p50", func(l checkLatency) time.Duration { return l.HandoffP50 }),
		latRow("hand-off p99", func(l checkLatency) time.Duration { return l.HandoffP99 }),
	}})
	// Tests in the order the suite ran them, across deployments.
	var names []string
	seen := map[string]bool{}
	byDep := make([]map[string]testJSON, len(rep.Deployments))
	for i, d := range rep.Deployments {
		byDep[i] = map[string]testJSON{}
		for _, tc := range d.Tests {
			byDep[i][tc.Name] = tc
			if !seen[tc.Name] {
				seen[tc.Name] = true
				names = append(names, tc.Name)
			}
		}
	}
	var tests []tableRow
	for _, name := range names {
		r := tableRow{name: name}
		for i := range rep.Deployments {
			tc, ok := byDep[i][name]
			c := tableCell{text: "-"}
			if ok {
				c = tableCell{text: strings.ToUpper(tc.Status), status: tc.Status}
				if tc.Status != "pass" {
					c.note = note(tc.Reason)
				}
			}
			r.cells = append(r.cells, c)
		}
		tests = append(tests, r)
	}
	t.sections = append(t.sections, tableSection{head: "TEST", rows: tests})
	return t
}

// printComparison prints the table of several deployments, the footnotes,
// what each cleanup did and left, and a summary.
func printComparison(w io.Writer, rep checkReportJSON, deps []*deployment, took time.Duration) {
	t := buildComparison(rep, deps)
	fmt.Fprintf(w, "dlock check: %d deployments\n\n", len(deps))
	for _, s := range t.sections {
		rows := [][]string{append([]string{s.head}, t.columns...)}
		for _, r := range s.rows {
			row := []string{r.name}
			for _, c := range r.cells {
				row = append(row, c.String())
			}
			rows = append(rows, row)
		}
		writeTable(w, rows)
		fmt.Fprintln(w)
	}
	for i, n := range t.notes {
		fmt.Fprintf(w, "[%d] %s\n", i+1, n)
	}
	if len(t.notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, d := range deps {
		for _, r := range d.results {
			if r.Name != "" && r.Status == "FAIL" && len(r.Output) > 0 {
				fmt.Fprintf(w, "--- %s on %s\n", r.Name, d.plan.shown)
				for _, l := range r.Output {
					fmt.Fprintf(w, "    %s\n", l)
				}
			}
		}
		if d.crash != nil && !d.crash.timedOut && len(d.crash.output) > 0 {
			fmt.Fprintf(w, "--- %s on %s: %s\n", d.crash.where(), d.plan.shown, d.crash.reason)
			for _, l := range d.crash.output {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
	for _, d := range deps {
		if d.cleanup != "" {
			fmt.Fprintf(w, "%s: %s\n", d.plan.shown, d.cleanup)
		}
		for _, l := range d.left {
			fmt.Fprintf(w, "%s: left behind: %s\n", d.plan.shown, l)
		}
	}
	var verdicts []string
	failed := false
	for _, d := range rep.Deployments {
		verdicts = append(verdicts, d.DSN+" "+d.Result)
		failed = failed || d.Result != "pass"
	}
	verdict := "PASS"
	if failed {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s in %s: %s\n", verdict, formatDuration(took), strings.Join(verdicts, ", "))
}

var checkTemplate = template.Must(template.New("check").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dlock check</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0 2em; }
th, td { padding: 0.3em 0.8em; border: 1px solid #ddd; text-align: left; }
th.section { background: #f4f4f4; }
td.pass { background: #d4edda; }
td.fail { background: #f8d7da; }
td.skip { background: #fff3cd; }
sup { color: #555; }
ol { font-size: 0.9em; }
</style>
</head>
<body>
<h1>dlock check</h1>
<p>{{.When}} · {{.Host}} · {{.Took}}</p>
<table>
{{- range .Sections}}
<tr><th class="section">{{.Head}}</th>{{range $.Columns}}<th>{{.}}</th>{{end}}</tr>
{{- range .Rows}}
<tr><td>{{.Name}}</td>{{range .Cells}}<td{{if .Status}} class="{{.Status}}"{{end}}>{{.Text}}{{if .Note}} <sup>[{{.Note}}]</sup>{{end}}</td>{{end}}</tr>
{{- end}}
{{- end}}
</table>
{{- if .Notes}}
<ol>
{{- range .Notes}}
<li>{{.}}</li>
{{- end}}
</ol>
{{- end}}
{{- range .Deployments}}
<p><b>{{.DSN}}</b>: {{.Result}}{{if .Cleanup}}. {{.Cleanup}}{{end}}{{range .LeftBehind}}<br>Left behind: {{.}}{{end}}</p>
{{- end}}
<p>Latency: an uncontended acquire (one client takes and releases a free lock), and the hand-off from a
release to the next holder's grant (two clients contend), measured briefly after the suite. Numbers depend
on the network, the servers' load and the machine; compare deployments measured in one run.</p>
</body>
</html>
`))

func writeCheckHTML(b *bytes.Buffer, rep checkReportJSON, deps []*deployment) error {
	t := buildComparison(rep, deps)
	type cell struct {
		Text, Status string
		Note         int
	}
	type row struct {
		Name  string
		Cells []cell
	}
	type section struct {
		Head string
		Rows []row
	}
	data := struct {
		When, Host, Took string
		Columns          []string
		Sections         []section
		Notes            []string
		Deployments      []deploymentJSON
	}{
		When:        time.Now().Format("2006-01-02 15:04 MST"),
		Host:        fmt.Sprintf("dlock %s, %s/%s, %d CPUs", version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
		Took:        formatDuration(time.Duration(rep.Seconds * float64(time.Second))),
		Columns:     t.columns,
		Notes:       t.notes,
		Deployments: rep.Deployments,
	}
	heads := map[string]string{"CAPABILITY": "Capability", "LATENCY": "Latency", "TEST": "Test"}
	for _, s := range t.sections {
		sec := section{Head: heads[s.head]}
		for _, r := range s.rows {
			rw := row{Name: r.name}
			if s.head == "CAPABILITY" {
				rw.Name = strings.ReplaceAll(r.name, "-", " ")
			}
			for _, c := range r.cells {
				rw.Cells = append(rw.Cells, cell{c.text, c.status, c.note})
			}
			sec.Rows = append(sec.Rows, rw)
		}
		data.Sections = append(data.Sections, sec)
	}
	if err := checkTemplate.Execute(b, data); err != nil {
		return errors.New("writing the report: " + err.Error())
	}
	return nil
}
