package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/observe"
)

// fleetChildEnv carries the DSN to a child process of BenchmarkFleet; set, it
// makes TestFleetChild serve the parent's commands instead of skipping.
const fleetChildEnv = "DLOCK_FLEET_CHILD_DSN"

// fleetIDEnv carries the child's number (0 …) to the child.
const fleetIDEnv = "DLOCK_FLEET_CHILD_ID"

// fleetPrefix starts every line of the protocol a child writes on stdout; the
// parent ignores the test binary's other output.
const fleetPrefix = "FLEET "

// maxFleetSamples bounds the latency samples one child returns per command.
const maxFleetSamples = 4000

// fleetCmd is one command of the parent to a child, one JSON line on stdin.
type fleetCmd struct {
	// Op is "hold" (take N leases of TTL, spread over TTL/3, and keep them
	// renewed), "mark"
	// (report the renewals so far), "release" (release the held leases),
	// "contend" (N workers wait for Keys for For, holding each grant Hold),
	// "cycle" (N workers take and release a key of their own for For,
	// holding each grant Hold) or "quit".
	Op   string        `json:"op"`
	N    int           `json:"n,omitempty"`
	TTL  time.Duration `json:"ttl,omitempty"`
	Hold time.Duration `json:"hold,omitempty"`
	For  time.Duration `json:"for,omitempty"`
	Keys []string      `json:"keys,omitempty"`
}

// fleetGrant is one grant of a contended key, in unix nanoseconds.
type fleetGrant struct {
	Key    int   `json:"k"`
	Holder int   `json:"h"` // child*1000 + worker
	Got    int64 `json:"g"` // Acquire returned
	Rel    int64 `json:"r"` // Release called
}

// fleetReply is a child's answer to one command, one JSON line on stdout.
type fleetReply struct {
	Err      string       `json:"err,omitempty"` // the command could not run
	Renewals int64        `json:"renewals,omitempty"`
	Lost     int          `json:"lost,omitempty"`
	Grants   []fleetGrant `json:"grants,omitempty"`
	Cycles   int          `json:"cycles,omitempty"`
	Lat      []int64      `json:"lat,omitempty"` // acquire + release, ns, at most maxFleetSamples
	Errors   int          `json:"errors,omitempty"`
	FirstErr string       `json:"first_err,omitempty"`
}

// renewCounter counts the successful renewals of a Locker's leases.
type renewCounter struct{ n *atomic.Int64 }

func (r renewCounter) StartAcquire(ctx context.Context, _ observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(observe.AcquireOutcome) observe.LeaseObserver { return r }
}

func (r renewCounter) Renewed(_ time.Duration, err error) {
	if err == nil {
		r.n.Add(1)
	}
}

func (r renewCounter) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (r renewCounter) Ended(observe.LeaseEnd) {}

// TestFleetChild is one client process of BenchmarkFleet: one Locker on the
// DSN in fleetChildEnv, driven by JSON commands on stdin (fleetCmd), answered
// on stdout (fleetReply). Without fleetChildEnv it skips.
func TestFleetChild(t *testing.T) {
	dsn := os.Getenv(fleetChildEnv)
	if dsn == "" {
		t.Skip("runs only as a child process of BenchmarkFleet")
	}
	id, err := strconv.Atoi(os.Getenv(fleetIDEnv))
	if err != nil {
		t.Fatalf("%s: %v", fleetIDEnv, err)
	}
	ctx := context.Background()
	var renewals atomic.Int64
	l, err := dlock.Open(ctx, dsn, dlock.WithObserver(renewCounter{&renewals}))
	out := bufio.NewWriter(os.Stdout)
	send := func(r fleetReply) {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out.WriteString(fleetPrefix)
		out.Write(b)
		out.WriteString("\n")
		if err := out.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err != nil {
		send(fleetReply{Err: err.Error()})
		return
	}
	defer func() { _ = l.Close() }()
	send(fleetReply{}) // ready
	var held []*dlock.Lease
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		var c fleetCmd
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			send(fleetReply{Err: err.Error()})
			continue
		}
		switch c.Op {
		case "hold":
			// Spread over TTL/3, as the grants of a fleet come: leases taken
			// together renew together, in bursts.
			r := fleetReply{}
			gap := c.TTL / 3 / time.Duration(max(1, c.N))
			for i := range c.N {
				if i > 0 {
					time.Sleep(gap)
				}
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("fleet/steady/%d/%d", id, i), dlock.WithTTL(c.TTL))
				if err != nil {
					r.Err = err.Error()
					break
				}
				held = append(held, lease)
			}
			send(r)
		case "mark":
			send(fleetReply{Renewals: renewals.Load()})
		case "release":
			r := fleetReply{}
			for _, lease := range held {
				if lease.Err() != nil {
					r.Lost++
					if r.FirstErr == "" {
						r.FirstErr = lease.Err().Error()
					}
				}
				_ = lease.Release(ctx)
			}
			held = nil
			send(r)
		case "contend":
			send(fleetContend(l, id, c))
		case "cycle":
			send(fleetCycle(l, id, c))
		case "quit":
			return
		default:
			send(fleetReply{Err: "unknown op " + strconv.Quote(c.Op)})
		}
	}
}

// fleetContend runs c.N workers that wait for c.Keys (worker j of child id
// waits for key (id·N + j) mod len) until c.For has passed, holding each grant
// c.Hold.
func fleetContend(l dlock.Locker, id int, c fleetCmd) fleetReply {
	ctx, cancel := context.WithTimeout(context.Background(), c.For)
	defer cancel()
	var (
		mu  sync.Mutex
		r   fleetReply
		wg  sync.WaitGroup
		bad = func(err error) {
			mu.Lock()
			defer mu.Unlock()
			r.Errors++
			if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
		}
	)
	for j := range c.N {
		k := (id*c.N + j) % len(c.Keys)
		wg.Go(func() {
			for ctx.Err() == nil {
				lease, err := l.Acquire(ctx, c.Keys[k])
				if err != nil {
					if ctx.Err() == nil {
						bad(err)
					}
					continue
				}
				got := time.Now()
				time.Sleep(c.Hold)
				rel := time.Now()
				if err := lease.Release(context.Background()); err != nil {
					bad(err)
				}
				mu.Lock()
				r.Grants = append(r.Grants, fleetGrant{Key: k, Holder: id*1000 + j, Got: got.UnixNano(), Rel: rel.UnixNano()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return r
}

// fleetCycle runs c.N workers that take and release a key of their own until
// c.For has passed, holding each grant c.Hold; the latency samples leave the
// hold out.
func fleetCycle(l dlock.Locker, id int, c fleetCmd) fleetReply {
	deadline := time.Now().Add(c.For)
	var (
		mu sync.Mutex
		r  fleetReply
		wg sync.WaitGroup
	)
	for j := range c.N {
		key := fmt.Sprintf("fleet/cycle/%d/%d", id, j)
		wg.Go(func() {
			for time.Now().Before(deadline) {
				t0 := time.Now()
				lease, err := l.TryAcquire(context.Background(), key)
				if err == nil {
					t1 := time.Now()
					time.Sleep(c.Hold)
					t2 := time.Now()
					err = lease.Release(context.Background())
					if err == nil {
						d := t1.Sub(t0) + time.Since(t2)
						mu.Lock()
						r.Cycles++
						if len(r.Lat) < maxFleetSamples {
							r.Lat = append(r.Lat, d.Nanoseconds())
						}
						mu.Unlock()
						continue
					}
				}
				mu.Lock()
				r.Errors++
				if r.FirstErr == "" {
					r.FirstErr = err.Error()
				}
				mu.Unlock()
				// A key whose release failed may stay held until its TTL.
				key = fmt.Sprintf("fleet/cycle/%d/%d/%d", id, j, time.Now().UnixNano())
			}
		})
	}
	wg.Wait()
	return r
}
