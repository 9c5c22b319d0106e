package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// deployment is what dlock check found on one deployment.
type deployment struct {
	plan     checkPlan
	caps     backend.Capabilities
	shortTTL time.Duration
	notes    []string // the driver's notes on the deployment

	openStep string // what failed when openErr is set: "cannot open", …
	openErr  error  // the deployment could not be reached

	results []testResult
	crash   *suiteCrash // the suite ended without finishing
	latency checkLatency

	cleanup string   // what dlock deleted, as a sentence; "" if nothing
	left    []string // what remains, and how to remove it
	elapsed time.Duration
}

// failed returns the number of failed tests; a crash, a timeout or a
// failure of the suite's setup counts as one.
func (d *deployment) failed() int {
	n := 0
	setup := false
	for _, r := range d.results {
		switch {
		case r.Status != "FAIL":
		case r.Name == "":
			setup = true
		default:
			n++
		}
	}
	if d.crash != nil || (n == 0 && setup) {
		n++
	}
	return n
}

// checkLatency is a short measurement of a deployment's latency.
type checkLatency struct {
	AcquireP50, AcquireP99 time.Duration
	HandoffP50, HandoffP99 time.Duration
	Err                    error
}

// latencyWindow is how long dlock check measures: the uncontended acquire,
// then the hand-off between two clients.
const (
	latencyAcquire = 500 * time.Millisecond
	latencyHandoff = time.Second
)

// line is the latency as a sentence, for the report of one deployment.
func (l checkLatency) line() string {
	switch {
	case l.Err != nil:
		return "Latency: not measured: " + errText(l.Err)
	case l.AcquireP50 == 0:
		return ""
	}
	return fmt.Sprintf("Latency: uncontended acquire p50 %s, p99 %s; hand-off p50 %s, p99 %s.",
		formatDuration(l.AcquireP50), formatDuration(l.AcquireP99), formatDuration(l.HandoffP50), formatDuration(l.HandoffP99))
}

// checkAll checks each deployment: the probes one at a time (each collects
// its driver's notes), then the suites, at once on different servers and
// one after another on the same servers.
func checkAll(ctx context.Context, plans []checkPlan, s checkSettings) []*deployment {
	deps := make([]*deployment, len(plans))
	for i, p := range plans {
		deps[i] = &deployment{plan: p}
		if ctx.Err() == nil {
			deps[i].probe(ctx)
		}
	}
	// Drivers opened from here on would repeat the notes shown.
	stopCollect := collectLogs()
	defer stopCollect()
	groups := map[string][]*deployment{}
	var order []string
	for _, d := range deps {
		if d.openErr != nil {
			continue
		}
		k := serversOf(d.plan.user)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], d)
	}
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Go(func() {
			for _, d := range groups[k] {
				if ctx.Err() != nil {
					return
				}
				d.check(ctx, s)
			}
		})
	}
	wg.Wait()
	return deps
}

// serversOf names the servers of a DSN, so that deployments on the same
// servers are not checked at once: its hosts, or the whole DSN for an
// in-process backend.
func serversOf(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "mem" || u.Host == "" {
		return dsn
	}
	return strings.ToLower(u.Host)
}

// probe opens the deployment and reads its capabilities. On PostgreSQL it
// falls back to the user's fence table if the check cannot create its own.
func (d *deployment) probe(ctx context.Context) {
	stopCollect := collectLogs()
	caps, ttl, err := probe(ctx, d.plan.dsn)
	notes := stopCollect()
	if err != nil && d.plan.table != "" && ctx.Err() == nil {
		if c2, t2, err2 := probe(ctx, d.plan.user); err2 == nil {
			d.plan.dsn, d.plan.table, d.plan.remain = d.plan.user, "", pgUserTableRemain
			caps, ttl, err = c2, t2, nil
		}
	}
	d.caps, d.shortTTL, d.notes = caps, ttl, notes
	if err != nil {
		d.openStep = "cannot open"
		var se *stepError
		if errors.As(err, &se) {
			d.openStep, err = se.step, se.err
		}
		d.openErr = err
	}
}

// check runs the suite on the deployment, measures its latency and cleans
// up.
func (d *deployment) check(ctx context.Context, s checkSettings) {
	start := time.Now()
	c := &checkRun{plan: d.plan, shortTTL: d.shortTTL, run: s.run, timeout: s.timeout, verbose: s.verbose, progress: s.progress}
	if s.multi {
		c.label = d.plan.shown
	}
	d.results, d.crash = c.suite(ctx)
	if d.crash != nil && d.crash.timedOut {
		fmt.Fprintf(s.progress, "dlock: %s: timed out after %v in %s\n", d.plan.shown, s.timeout, d.crash.where())
	}
	if d.crash == nil && ctx.Err() == nil {
		d.latency = measureLatency(ctx, d.plan.dsn)
	}
	d.cleanup, d.left = c.cleanup(d.crash != nil)
	d.elapsed = time.Since(start)
}

// measureLatency measures the uncontended acquire and the hand-off between
// two clients, as dlock bench does, briefly.
func measureLatency(ctx context.Context, dsn string) checkLatency {
	var lockers []dlock.Locker
	defer func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}()
	for range 2 {
		l, err := openLocker(ctx, dsn)
		if err != nil {
			return checkLatency{Err: err}
		}
		lockers = append(lockers, l)
	}
	base := "dlock-bench/" + randomID()
	prog := &progress{w: io.Discard}
	var r benchResult
	if err := measureAcquire(ctx, lockers[0], base+"/uncontended", latencyAcquire, prog, &r); err != nil {
		return checkLatency{Err: fmt.Errorf("uncontended acquire: %w", err)}
	}
	if err := measureContended(ctx, lockers, base+"/contended", latencyHandoff, prog, &r); err != nil {
		return checkLatency{Err: fmt.Errorf("hand-off: %w", err)}
	}
	return checkLatency{AcquireP50: r.AcquireP50, AcquireP99: r.AcquireP99, HandoffP50: r.HandoffP50, HandoffP99: r.HandoffP99}
}
