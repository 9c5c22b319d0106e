package main

// This file is the one seam between dlock check and package testing: the
// child process runs the conformance suite under testing.Main (the suite
// takes a *testing.T), and the parent reads the child's -test.v=test2json
// output. TestOutputParser pins the format parsed here, and TestCheckRedis
// runs the real child.

import (
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
)

// testResult is the outcome of one test of the conformance suite.
type testResult struct {
	Name    string // the test's name under the suite, e.g. "MutualExclusion"; "" for the suite itself
	Status  string // "PASS", "FAIL" or "SKIP"
	Elapsed time.Duration
	Output  []string // what the test logged, without file:line prefixes
}

// note returns the line of a test's output that says why it failed or was
// skipped: the first line logged by a failed test, the last by a skipped one.
func (r testResult) note() string {
	var lines []string
	for _, l := range r.Output {
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, " ") {
			lines = append(lines, l)
		}
	}
	switch {
	case len(lines) == 0, r.Status == "PASS":
		return ""
	case r.Status == "SKIP":
		return lines[len(lines)-1]
	default:
		return lines[0]
	}
}

// suiteName is the name of the one top-level test that runs the conformance
// suite in the child process of dlock check.
const suiteName = "Conformance"

// outputParser reads the output of a test binary run with -test.v=test2json,
// line by line. In that mode the testing package marks each of its own lines
// (=== RUN, --- PASS and the like) with a leading ^V (0x16), so output that a
// test logs can never pass for one; a test's output follows its "=== RUN" or
// "=== NAME" line.
type outputParser struct {
	onResult func(testResult) // called as each test ends; may be nil

	current  string              // full name of the test the output belongs to
	output   map[string][]string // by full test name
	results  []testResult        // in the order the tests ended
	finished bool                // the final PASS or FAIL line was seen
}

var fileLine = regexp.MustCompile(`^[^\s:]+\.go:\d+: `)

// line consumes one line of output, without its newline.
func (p *outputParser) line(s string) {
	if p.output == nil {
		p.output = map[string][]string{}
	}
	if frame, ok := strings.CutPrefix(strings.TrimLeft(s, " "), "\x16"); ok {
		p.frame(frame)
		return
	}
	// A test's log lines are indented by four spaces; the continuation lines
	// of a multi-line message by four more.
	s = strings.TrimPrefix(s, "    ")
	s = fileLine.ReplaceAllString(s, "")
	p.output[p.current] = append(p.output[p.current], s)
}

func (p *outputParser) frame(f string) {
	switch {
	case strings.HasPrefix(f, "=== RUN "), strings.HasPrefix(f, "=== NAME"), strings.HasPrefix(f, "=== CONT "):
		p.current = strings.TrimSpace(f[len("=== NAME"):])
	case strings.HasPrefix(f, "--- PASS: "), strings.HasPrefix(f, "--- FAIL: "), strings.HasPrefix(f, "--- SKIP: "):
		status := f[4:8]
		name, elapsed := splitElapsed(f[len("--- PASS: "):])
		r := testResult{
			Name:    strings.TrimPrefix(strings.TrimPrefix(name, suiteName), "/"),
			Status:  status,
			Elapsed: elapsed,
			Output:  p.output[name],
		}
		delete(p.output, name)
		p.results = append(p.results, r)
		if p.onResult != nil {
			p.onResult(r)
		}
	case f == "PASS", f == "FAIL":
		p.finished = true
	}
}

// splitElapsed splits "Name (1.23s)" into the name and the duration.
func splitElapsed(s string) (string, time.Duration) {
	i := strings.LastIndex(s, " (")
	if i < 0 || !strings.HasSuffix(s, ")") {
		return s, 0
	}
	d, err := time.ParseDuration(s[i+2 : len(s)-1])
	if err != nil {
		return s, 0
	}
	return s[:i], d
}

// running returns the full name of the test that was running last and has
// not ended, and what it logged: after a crash, the test that crashed.
func (p *outputParser) running() (string, []string) {
	return p.current, p.output[p.current]
}

// displayLine is a line of the child's output as a person reads it: without
// the test2json frame marker.
func displayLine(s string) string { return strings.TrimLeft(s, "\x16") }

// checkSuiteMain is the child process of dlock check: it runs the
// conformance suite under package testing, which parses args (-test.run,
// -test.v, ...) and exits.
func checkSuiteMain(args []string) int {
	// The parent has shown the driver's notes; every locker would repeat them.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	h := &checkHarness{dsn: os.Getenv(envCheckDSN), shortTTL: conformance.DefaultShortTTL}
	if d, err := time.ParseDuration(os.Getenv(envCheckShortTTL)); err == nil && d > 0 {
		h.shortTTL = d
	}
	if u, err := backend.ParseDSN(h.dsn); err == nil {
		h.scheme = u.Scheme
	}
	if os.Getenv(envCheckAdmin) == "redis" {
		admin, err := newRedisAdmin(h.dsn)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dlock: %v\n", err)
			return exitUnavailable
		}
		h.admin = admin // closed by the exit
	}
	os.Args = append([]string{os.Args[0]}, args...)
	testing.Main(regexp.MatchString, []testing.InternalTest{{
		Name: suiteName,
		F:    func(t *testing.T) { conformance.Run(t, h) },
	}}, nil, nil)
	return exitOK // not reached: testing.Main exits
}
