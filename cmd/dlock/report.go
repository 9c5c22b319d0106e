package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"html/template"
	"os"
	"runtime"
	"strings"
	"time"
)

// barChart is a horizontal bar chart: for each label (a backend), one bar
// per series (such as p50 and p99).
type barChart struct {
	Title  string
	Axis   string // what the bars' length measures, with its unit, under the value axis
	Labels []string
	Series []chartSeries
	Format func(float64) string // a value as text, next to its bar
}

type chartSeries struct {
	Name   string
	Color  string
	Values []float64 // one per label; ≤ 0 means none
}

// Layout of a chart, in SVG user units (pixels).
const (
	chartWidth  = 760
	labelWidth  = 250 // the column of backend names
	valueWidth  = 90  // room for the value after the longest bar
	barHeight   = 16
	barGap      = 3
	groupGap    = 14
	chartTop    = 52 // title and legend
	chartBottom = 30 // the value axis and its caption
)

// svg renders the chart as a standalone <svg> element.
func (c barChart) svg() string {
	var b strings.Builder
	height := c.height()
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, sans-serif" font-size="12">`,
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<title>%s</title>`, xmlText(c.Title))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`, chartWidth, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">%s</text>`, xmlText(c.Title))
	x := labelWidth
	for _, s := range c.Series {
		fmt.Fprintf(&b, `<rect x="%d" y="30" width="12" height="12" fill="%s"/>`, x, s.Color)
		fmt.Fprintf(&b, `<text x="%d" y="40">%s</text>`, x+16, xmlText(s.Name))
		x += 30 + 8*len(s.Name)
	}

	top := 0.0
	for _, s := range c.Series {
		for _, v := range s.Values {
			top = max(top, v)
		}
	}
	scale := 0.0
	if top > 0 {
		scale = float64(chartWidth-labelWidth-valueWidth) / top
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888888"/>`, labelWidth, chartTop-4, labelWidth, height-chartBottom+4)
	y := chartTop
	for i, label := range c.Labels {
		groupHeight := len(c.Series)*(barHeight+barGap) - barGap
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelWidth-8, y+groupHeight/2+4, xmlText(shorten(label, 40)))
		for _, s := range c.Series {
			v := 0.0
			if i < len(s.Values) {
				v = s.Values[i]
			}
			w := v * scale
			if v > 0 {
				w = max(w, 1) // visible however small
			}
			fmt.Fprintf(&b, `<rect class="bar" x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`,
				labelWidth, y, w, barHeight, s.Color, xmlText(label), xmlText(s.Name), xmlText(c.value(v)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`, float64(labelWidth)+w+4, y+barHeight-4, xmlText(c.value(v)))
			y += barHeight + barGap
		}
		y += groupGap - barGap
	}
	axisY := height - chartBottom + 4
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888888"/>`, labelWidth, axisY, chartWidth-valueWidth, axisY)
	fmt.Fprintf(&b, `<text class="axis-label" x="%d" y="%d" fill="#555555" font-size="11">0</text>`, labelWidth-3, axisY+14)
	fmt.Fprintf(&b, `<text class="axis-label" x="%d" y="%d" text-anchor="middle" fill="#555555" font-size="11">%s</text>`,
		(labelWidth+chartWidth-valueWidth)/2, axisY+14, xmlText(c.Axis))
	b.WriteString(`</svg>`)
	return b.String()
}

func (c barChart) height() int {
	groups := len(c.Labels)
	return chartTop + groups*(len(c.Series)*(barHeight+barGap)-barGap) + max(groups-1, 0)*groupGap + chartBottom
}

func (c barChart) value(v float64) string {
	if v <= 0 {
		return "n/a"
	}
	return c.Format(v)
}

// xmlText escapes s for XML text and attribute values.
func xmlText(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// benchCharts returns the charts of a dlock bench report.
func benchCharts(results []benchResult) []barChart {
	labels := make([]string, len(results))
	acqP50, acqP99 := make([]float64, len(results)), make([]float64, len(results))
	rate := make([]float64, len(results))
	hoP50, hoP99 := make([]float64, len(results)), make([]float64, len(results))
	clients := 0
	for i, r := range results {
		labels[i] = r.DSN
		acqP50[i], acqP99[i] = float64(r.AcquireP50), float64(r.AcquireP99)
		rate[i] = r.Throughput
		hoP50[i], hoP99[i] = float64(r.HandoffP50), float64(r.HandoffP99)
		clients = r.Clients
	}
	dur := func(v float64) string { return formatDuration(time.Duration(v)) }
	const p50Color, p99Color = "#4e79a7", "#f28e2b"
	return []barChart{
		{
			Title:  "Uncontended acquire latency (lower is better)",
			Axis:   "time from acquire call to grant, p50 and p99",
			Labels: labels,
			Series: []chartSeries{{"p50", p50Color, acqP50}, {"p99", p99Color, acqP99}},
			Format: dur,
		},
		{
			Title:  fmt.Sprintf("Contended throughput, %d clients on one key (higher is better)", clients),
			Axis:   "grants per second",
			Labels: labels,
			Series: []chartSeries{{"grants per second", "#59a14f", rate}},
			Format: func(v float64) string { return formatRate(v) + "/s" },
		},
		{
			Title:  "Hand-off latency, release to next grant (lower is better)",
			Axis:   "time from a release to the next holder's grant, p50 and p99",
			Labels: labels,
			Series: []chartSeries{{"p50", p50Color, hoP50}, {"p99", p99Color, hoP99}},
			Format: dur,
		},
	}
}

// writeReport writes the report of a dlock bench run to path, as a
// self-contained HTML page or as one SVG image.
func writeReport(path, format string, results []benchResult, s benchSettings) error {
	charts := benchCharts(results)
	var b bytes.Buffer
	switch format {
	case "svg":
		writeSVGReport(&b, charts)
	default:
		if err := writeHTMLReport(&b, charts, results, s); err != nil {
			return err
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// writeSVGReport stacks the charts in one SVG image.
func writeSVGReport(b *bytes.Buffer, charts []barChart) {
	height := 0
	for _, c := range charts {
		height += c.height() + 10
	}
	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`, chartWidth, height, chartWidth, height)
	b.WriteString(`<title>dlock bench</title>`)
	y := 0
	for _, c := range charts {
		fmt.Fprintf(b, `<g transform="translate(0,%d)">%s</g>`, y, c.svg())
		y += c.height() + 10
	}
	b.WriteString("</svg>\n")
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dlock bench</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0 2em; }
th, td { padding: 0.3em 0.8em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.err { color: #b00; }
figure { margin: 0 0 1.5em; }
</style>
</head>
<body>
<h1>dlock bench</h1>
<p>{{.When}} · {{.Clients}} contending clients · {{.Duration}} per backend · {{.Host}}</p>
<table>
<tr><th>Backend</th><th>Fencing</th><th>Acquire p50</th><th>p99</th><th>Contended</th><th>Hand-off p50</th><th>p99</th><th>Changed hands</th></tr>
{{- range .Rows}}
<tr><td>{{.DSN}}</td><td>{{.Fencing}}</td><td>{{.AcquireP50}}</td><td>{{.AcquireP99}}</td><td>{{.Throughput}}</td><td>{{.HandoffP50}}</td><td>{{.HandoffP99}}</td><td>{{.Changed}}</td></tr>
{{- if .Err}}
<tr><td class="err" colspan="8">{{.Err}}</td></tr>
{{- end}}
{{- end}}
</table>
{{range .Charts}}<figure>{{.}}</figure>
{{end -}}
<p>Acquire: one client takes and releases a free lock in a loop. Contended: every client loops
acquire → release on one key. Hand-off: from the start of a release to the next holder's grant.
Numbers depend on the network, the servers' load and the machine; compare backends measured in one run.</p>
</body>
</html>
`))

func writeHTMLReport(b *bytes.Buffer, charts []barChart, results []benchResult, s benchSettings) error {
	type row struct {
		DSN, Fencing, AcquireP50, AcquireP99, Throughput, HandoffP50, HandoffP99, Changed, Err string
	}
	data := struct {
		When, Duration, Host string
		Clients              int
		Rows                 []row
		Charts               []template.HTML
	}{
		When:     time.Now().Format("2006-01-02 15:04 MST"),
		Duration: s.duration.String(),
		Host:     fmt.Sprintf("dlock %s, %s/%s, %d CPUs", version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
		Clients:  s.clients,
	}
	for _, r := range results {
		rw := row{DSN: r.DSN, Fencing: r.Caps.Fencing.String(),
			AcquireP50: formatDuration(r.AcquireP50), AcquireP99: formatDuration(r.AcquireP99),
			Throughput: "-", HandoffP50: formatDuration(r.HandoffP50), HandoffP99: formatDuration(r.HandoffP99), Changed: "-"}
		if r.Grants > 0 {
			rw.Throughput = formatRate(r.Throughput) + " grants/s"
			rw.Changed = fmt.Sprintf("%.0f%%", r.ChangedHands)
		}
		if r.Unreachable {
			rw.Fencing = "-"
		}
		if r.Err != nil {
			rw.Err = errText(r.Err)
		}
		data.Rows = append(data.Rows, rw)
	}
	for _, c := range charts {
		// The SVG is built from escaped text only (see xmlText).
		data.Charts = append(data.Charts, template.HTML(c.svg()))
	}
	return reportTemplate.Execute(b, data)
}
