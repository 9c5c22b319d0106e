package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultPrefix is prepended to every Redis key and channel the driver
	// uses, on every node. DSN parameter "prefix".
	DefaultPrefix = "dlock:"

	// DefaultDriftFactor is the share of the TTL the driver does not count
	// on, for clock-rate differences between the client and the nodes; 2 ms
	// are added for timer slack. DSN parameter "drift".
	DefaultDriftFactor = 0.01

	// DefaultNodeTimeout bounds each request to one node. DSN parameter
	// "node_timeout".
	DefaultNodeTimeout = 100 * time.Millisecond

	// DefaultRetryDelay is the nominal delay before a waiting Acquire tries
	// again after an attempt that failed without a clear holder (a split
	// vote, a slow or failing node). DSN parameter "retry_delay".
	DefaultRetryDelay = 10 * time.Millisecond

	// DefaultPollInterval is the longest a waiting Acquire goes between two
	// attempts when no release message arrives. DSN parameter "poll".
	DefaultPollInterval = time.Second

	// DefaultPort is the port of a DSN host given without one.
	DefaultPort = "6379"
)

// Bounds of Options.DriftFactor.
const (
	minDriftFactor = 0.001
	maxDriftFactor = 0.5
)

// checkTimeout bounds the check of one node (INFO) when the driver is built.
const checkTimeout = 5 * time.Second

// ErrNoQuorum is matched by the error of an operation that could not reach a
// quorum of N/2+1 nodes (down, too slow, refusing) for another reason than a
// lock held by another owner; the error lists each failed node's NodeError.
var ErrNoQuorum = errors.New("no quorum")

var errClosed = fmt.Errorf("redlock driver: %w", backend.ErrClosed)

func init() {
	backend.Register("redlock", open)
	backend.Register("redlocks", open)
}

// NodeError is one node's part of a failed operation: its address (host:port)
// and its error, collected in a *multierror.Error that errors.As reaches.
type NodeError struct {
	Addr string
	Err  error
}

// Error returns "host:port: cause".
func (e *NodeError) Error() string { return e.Addr + ": " + e.Err.Error() }

// Unwrap returns e.Err.
func (e *NodeError) Unwrap() error { return e.Err }

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix is prepended to every Redis key and channel the driver uses. It
	// must not contain '{' or '}'. Empty means DefaultPrefix ("dlock:"). DSN
	// parameter "prefix".
	Prefix string

	// DriftFactor is the share of the TTL not counted on: validity is TTL −
	// elapsed − (TTL × DriftFactor + 2ms). Zero means DefaultDriftFactor
	// (0.01); else from 0.001 to 0.5. DSN parameter "drift".
	DriftFactor float64

	// NodeTimeout bounds each request to one node (for acquire and refresh,
	// at most a tenth of the TTL). Zero means DefaultNodeTimeout (100ms);
	// negative is an error. DSN parameter "node_timeout".
	NodeTimeout time.Duration

	// RetryDelay is the first nominal delay (jittered, doubling up to
	// PollInterval) before a waiting Acquire tries again after a split vote or
	// failed nodes. Zero means DefaultRetryDelay (10ms); negative is an error.
	// DSN parameter "retry_delay".
	RetryDelay time.Duration

	// PollInterval is the longest a waiting Acquire goes between two
	// attempts without a release message (jittered, cut short when enough
	// holders' TTLs run out). Zero means DefaultPollInterval (1s); negative is
	// an error. DSN parameter "poll".
	PollInterval time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Prefix == "" {
		r.Prefix = DefaultPrefix
	}
	if err := rediscore.CheckPrefix(r.Prefix); err != nil {
		return r, err
	}
	switch {
	case r.DriftFactor == 0:
		r.DriftFactor = DefaultDriftFactor
	case r.DriftFactor < minDriftFactor || r.DriftFactor > maxDriftFactor:
		return r, fmt.Errorf("drift factor must be from %g to %g, got %g", minDriftFactor, maxDriftFactor, r.DriftFactor)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"node timeout", &r.NodeTimeout, DefaultNodeTimeout},
		{"retry delay", &r.RetryDelay, DefaultRetryDelay},
		{"poll interval", &r.PollInterval, DefaultPollInterval},
	} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			return r, fmt.Errorf("%s must be > 0, got %v", d.name, *d.v)
		}
	}
	return r, nil
}

// Driver is the Redlock implementation of backend.Driver. Its methods are
// safe for concurrent use. Most programs use it through dlock.Open or New;
// build one with NewDriver to pass to dlock.New with your own options.
type Driver struct {
	nodes       []*node
	quorum      int
	prefix      string
	driftFactor float64
	nodeTimeout time.Duration
	retryDelay  time.Duration
	poll        time.Duration
	owned       bool     // Close closes the clients
	secret      *url.URL // the DSN, to keep its password out of errors; may be nil

	closed    atomic.Bool
	quit      chan struct{}  // closed by Close
	workers   *workers       // run the node requests
	releasing sync.Map       // lock key → chan struct{}, closed once a release has reached every node
	finishing sync.WaitGroup // releases completing on nodes that failed (see finishRelease)
	watches   sync.WaitGroup // Watch's goroutines
	finishMu  sync.Mutex     // guards noFinish; orders finishing.Add before Close's Wait
	noFinish  bool           // set by Close: no finishRelease starts any more
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// node is one Redis master.
type node struct {
	addr   string
	client *goredis.Client
	mux    *rediscore.Mux

	checked atomic.Bool // passed check
	mu      sync.Mutex
	refused error // non-nil: check found the node unusable (permanent)
}

// NewDriver returns a driver over clients, one per independent Redis master
// (each with ContextTimeoutEnabled), with opts nil for the defaults. It
// refuses, within ctx, a Cluster node, a replica, a Sentinel and a server
// reached twice (a node it cannot reach yet is checked before its first use).
// The caller keeps the clients: Close does not close them.
func NewDriver(ctx context.Context, clients []*goredis.Client, opts *Options) (*Driver, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: no Redis clients (Redlock needs N independent masters; 5 is usual)", dlock.ErrInvalidOption)
	}
	d := &Driver{
		quorum:      len(clients)/2 + 1,
		prefix:      o.Prefix,
		driftFactor: o.DriftFactor,
		nodeTimeout: o.NodeTimeout,
		retryDelay:  o.RetryDelay,
		poll:        o.PollInterval,
		quit:        make(chan struct{}),
		workers:     newWorkers(),
	}
	seen := map[string]bool{}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: client %d is nil", dlock.ErrInvalidOption, i)
		}
		addr := c.Options().Addr
		if seen[addr] {
			return nil, fmt.Errorf("%w: node %s is listed twice: the nodes must be independent servers", dlock.ErrInvalidOption, addr)
		}
		seen[addr] = true
		if !c.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("%w: node %s: the client's ContextTimeoutEnabled is false; Redlock bounds every node request by its node timeout, which go-redis enforces only with ContextTimeoutEnabled",
				dlock.ErrInvalidOption, addr)
		}
		d.nodes = append(d.nodes, &node{addr: addr, client: c, mux: rediscore.NewMux(c, errClosed)})
	}
	if err := d.checkAll(ctx); err != nil {
		d.closeMuxes()
		d.workers.stop()
		return nil, err
	}
	return d, nil
}

// New returns a dlock.Locker over the Redis servers behind clients:
// dlock.New(NewDriver(ctx, clients, opts), lockerOpts...). ctx bounds the
// check of the nodes only. Closing the Locker does not close the clients.
func New(ctx context.Context, clients []*goredis.Client, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, clients, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "redlock", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// checkAll checks every node in parallel and fails if a node is unusable, if
// two nodes are one server, or if fewer than a quorum answer.
func (d *Driver) checkAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	type result struct {
		runID string
		err   error
	}
	results := make([]result, len(d.nodes))
	var wg sync.WaitGroup
	for i, n := range d.nodes {
		wg.Go(func() {
			runID, err := n.check(ctx)
			results[i] = result{runID, err}
		})
	}
	wg.Wait()
	var failed []error
	owner := map[string]string{}
	for i, r := range results {
		n := d.nodes[i]
		if r.err != nil {
			if n.refusal() != nil {
				return fmt.Errorf("%w: %w", dlock.ErrInvalidOption, &NodeError{Addr: n.addr, Err: d.redact(r.err)})
			}
			failed = append(failed, &NodeError{Addr: n.addr, Err: d.redact(r.err)})
			continue
		}
		if other, dup := owner[r.runID]; dup {
			return fmt.Errorf("%w: nodes %s and %s are the same Redis server (run_id %s): the nodes must be independent servers",
				dlock.ErrInvalidOption, other, n.addr, r.runID)
		}
		owner[r.runID] = n.addr
	}
	if ok := len(d.nodes) - len(failed); ok < d.quorum {
		return fmt.Errorf("%w: %d of %d nodes could be checked, %d needed: %w", ErrNoQuorum, ok, len(d.nodes), d.quorum, nodeErrors(failed))
	}
	return nil
}

// check runs INFO on the node, once it has passed: it returns the server's
// run_id, or why the node cannot serve as a Redlock node (then remembered, and
// returned by every later check).
func (n *node) check(ctx context.Context) (runID string, err error) {
	if err := n.refusal(); err != nil {
		return "", err
	}
	info, err := n.client.Info(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("INFO: %w", err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	var refuse error
	switch {
	case fields["redis_mode"] == "sentinel":
		refuse = errors.New("is a Redis Sentinel, not a data node")
	case fields["cluster_enabled"] == "1" || fields["redis_mode"] == "cluster":
		refuse = errors.New("is a Redis Cluster node (cluster_enabled:1): Redlock needs N independent masters, and one Cluster is a single point of truth; use the redis driver for a Cluster")
	case fields["role"] != "" && fields["role"] != "master":
		refuse = fmt.Errorf("is a replica (role:%s), not an independent master", fields["role"])
	}
	if refuse != nil {
		n.mu.Lock()
		n.refused = refuse
		n.mu.Unlock()
		return "", refuse
	}
	n.checked.Store(true)
	return fields["run_id"], nil
}

func (n *node) refusal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refused
}

// ready checks the node before its first use, if it could not be checked
// when the driver was built.
func (n *node) ready(ctx context.Context) error {
	if n.checked.Load() {
		return nil
	}
	_, err := n.check(ctx)
	return err
}

// Name returns "redlock".
func (d *Driver) Name() string { return "redlock" }

// Prefix returns the prefix of the driver's keys.
func (d *Driver) Prefix() string { return d.prefix }

// Nodes returns the nodes' addresses (host:port), in the order given.
func (d *Driver) Nodes() []string {
	addrs := make([]string, len(d.nodes))
	for i, n := range d.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// Quorum returns N/2+1, the number of nodes that must agree.
func (d *Driver) Quorum() int { return d.quorum }

// Capabilities reports timing-dependent fencing, client-side time authority,
// push-based waiting and fault tolerance (with N ≥ 3 nodes); no FIFO order and
// no loss notification.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingTimingDependent,
		FIFO:          false,
		FaultTolerant: len(d.nodes) >= 3,
		TimeAuthority: backend.TimeClient,
		PushWait:      true,
		LossNotify:    false,
	}
}

// Close stops the driver's pub/sub connections and goroutines, gives the
// releases that failed on some node a last try (within 2s), and closes the
// clients if it opened them from a DSN. Waiting Acquires and a second Close
// fail with ErrClosed.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	close(d.quit)
	d.finishMu.Lock()
	d.noFinish = true
	d.finishMu.Unlock()
	d.finishing.Wait() // they make a last try, bounded by closeGrace
	d.closeMuxes()
	d.watches.Wait()
	d.workers.stop()
	if !d.owned {
		return nil
	}
	var errs []error
	for _, n := range d.nodes {
		if err := n.client.Close(); err != nil {
			errs = append(errs, &NodeError{Addr: n.addr, Err: err})
		}
	}
	return errors.Join(errs...)
}

func (d *Driver) closeMuxes() {
	var wg sync.WaitGroup
	for _, n := range d.nodes {
		wg.Go(n.mux.Close)
	}
	wg.Wait()
}

// drift is the Redlock drift allowance for ttl: ttl × factor + 2 ms. With the
// default factor it is backend.DriftAllowance(ttl).
func (d *Driver) drift(ttl time.Duration) time.Duration {
	if d.driftFactor == DefaultDriftFactor {
		return backend.DriftAllowance(ttl)
	}
	return time.Duration(float64(ttl)*d.driftFactor) + 2*time.Millisecond
}

// ttlMillis converts ttl to the whole milliseconds sent as PX, and returns the
// validity a grant or refresh of that TTL gets counted from its send time
// (TTL − drift), and the timeout of each node request.
func (d *Driver) ttlMillis(ttl time.Duration) (ms int64, validity, nodeTimeout time.Duration, err error) {
	ms = ttl.Milliseconds()
	validity = time.Duration(ms)*time.Millisecond - d.drift(ttl)
	if validity <= 0 {
		return 0, 0, 0, fmt.Errorf("%w: ttl %v is too short for Redlock (it must leave time after the drift allowance of %v)",
			dlock.ErrInvalidOption, ttl, d.drift(ttl))
	}
	return ms, validity, max(min(d.nodeTimeout, ttl/10), time.Millisecond), nil
}
