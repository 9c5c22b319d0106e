package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// outcome is one node's answer to one request.
type outcome int

const (
	granted outcome = iota // acquired, extended or deleted for this owner
	refused                // held by another owner, or no longer this owner's
	failed                 // no usable answer: see reply.err
)

// reply is one node's answer.
type reply struct {
	node   *node
	out    outcome
	val    int64  // granted acquire: the node's token; refused acquire: the holder's PTTL in ms (-1: none)
	holder string // refused acquire: the holder's owner id
	err    error  // failed: a *NodeError
	maybe  bool   // failed: the request may have reached the node
}

// tally counts the replies gathered so far.
type tally struct {
	replies                  []reply
	granted, refused, failed int
}

func (t *tally) add(r reply) {
	t.replies = append(t.replies, r)
	switch r.out {
	case granted:
		t.granted++
	case refused:
		t.refused++
	default:
		t.failed++
	}
}

// gather is one request fanned out to every node.
type gather struct {
	ch      chan reply
	left    int // replies not yet read from ch
	tally   tally
	pending *sync.WaitGroup // requests still running
	cancel  context.CancelFunc
}

// fanout sends op to each of nodes in parallel, each request bounded by
// timeout. The requests ignore ctx's cancellation and deadline, which the
// caller checks: a request the caller stops waiting for still completes, so
// that a grant's late requests still set the lock on the nodes they reach,
// and a refresh still extends it everywhere. The caller reads the replies
// with collect. The requests never block, and Close waits for them. done,
// if not nil, is called once the last request has ended.
func (d *Driver) fanout(ctx context.Context, nodes []*node, timeout time.Duration, op func(context.Context, *node) reply, done func()) *gather {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	g := &gather{ch: make(chan reply, len(nodes)), left: len(nodes), pending: new(sync.WaitGroup), cancel: cancel}
	var running atomic.Int32
	running.Store(int32(len(nodes)))
	g.pending.Add(len(nodes))
	for _, n := range nodes {
		d.workers.run(func() {
			defer g.pending.Done()
			g.ch <- d.call(ctx, timeout, n, op)
			if running.Add(-1) == 0 { // the last request is done
				g.cancel()
				if done != nil {
					done()
				}
			}
		})
	}
	return g
}

// workerIdle is how long an idle worker waits for another request.
const workerIdle = 10 * time.Second

// workers run node requests on goroutines kept for reuse: a new goroutine's
// stack would have to grow to go-redis's call depth on every request, which
// costs more CPU than the request itself. A worker ends after workerIdle
// without work, or at Close, which waits for all of them.
type workers struct {
	work chan func() // unbuffered: a send succeeds only if a worker is idle
	quit chan struct{}
	wg   sync.WaitGroup
}

func newWorkers() *workers {
	return &workers{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle worker, or on a new one.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.wg.Add(1)
		go w.loop(f)
	}
}

func (w *workers) loop(f func()) {
	defer w.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-w.work:
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// stop ends the idle workers and waits for the busy ones to finish.
func (w *workers) stop() {
	close(w.quit)
	w.wg.Wait()
}

// collect reads replies until enough(tally) holds or every node has answered,
// and returns the tally. enough may be nil: every node.
func (g *gather) collect(enough func(*tally) bool) *tally {
	for g.left > 0 && (enough == nil || !enough(&g.tally)) {
		g.tally.add(<-g.ch)
		g.left--
	}
	return &g.tally
}

// call runs op on n, after n's first-use check, and names n in any error.
func (d *Driver) call(ctx context.Context, timeout time.Duration, n *node, op func(context.Context, *node) reply) reply {
	r := reply{node: n, out: failed}
	if err := n.ready(ctx); err != nil {
		r.err = err
	} else {
		r = op(ctx, n)
		r.node = n
	}
	if r.out == failed {
		err := r.err
		var ne net.Error
		if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
			err = fmt.Errorf("no reply within %v: %w", timeout, err)
		}
		r.err = &NodeError{Addr: n.addr, Err: d.redact(err)}
	}
	return r
}

// failure returns the reply for a failed request.
func failure(err error) reply {
	return reply{out: failed, err: err, maybe: rediscore.MayHaveRun(err)}
}

// redact keeps the DSN's password out of err.
func (d *Driver) redact(err error) error { return backend.RedactError(err, d.secret) }

// errNodeHeld describes a node where another owner holds the lock, in a list
// of per-node causes. It deliberately does not match backend.ErrHeld: a
// failure to reach a quorum is not "held".
var errNodeHeld = errors.New("held by another owner")

// errNodeNotHeld describes a node where this owner's lock is gone.
var errNodeNotHeld = errors.New("not held by this owner")

// causes returns the per-node causes of a failed operation: the failed
// nodes' errors, and notHeld for each node that refused (nil: leave those
// out), in node order.
func (d *Driver) causes(t *tally, notHeld error) *multierror.Error {
	var errs []error
	for _, n := range d.nodes {
		for _, r := range t.replies {
			if r.node != n {
				continue
			}
			switch {
			case r.out == failed:
				errs = append(errs, r.err)
			case r.out == refused && notHeld != nil:
				errs = append(errs, &NodeError{Addr: n.addr, Err: notHeld})
			}
		}
	}
	return nodeErrors(errs)
}

// nodeErrors collects errs in a multierror that formats on one line.
func nodeErrors(errs []error) *multierror.Error {
	m := &multierror.Error{Errors: errs, ErrorFormat: formatNodeErrors}
	return m
}

func formatNodeErrors(errs []error) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

// noQuorum is the error of an operation that reached too few nodes.
func (d *Driver) noQuorum(what string, t *tally, notHeld error) error {
	return fmt.Errorf("%w: %s on %d of %d nodes, %d needed: %w",
		ErrNoQuorum, what, t.granted, len(d.nodes), d.quorum, d.causes(t, notHeld))
}
