// Package election elects one leader among candidates on any dlock backend,
// with a fencing token per term.
//
// A candidate campaigns by acquiring the election's lock with its value (an
// address, say) as the lock's label: the holder is the leader, its lease's
// token the term's fencing token, and its label the value others read. A
// leader learns it is deposed exactly as a holder learns its lease is lost.
//
//	lead, err := election.Campaign(ctx, locker, "scheduler", "10.0.0.7:8080")
//	if err != nil { return err }
//	defer lead.Resign(context.Background())
//	// lead.Token() fences this term's writes; <-lead.Done() when it ends.
//
// Run does the common loop, configured by a Config; Leader reads who leads, and Observe follows it.
// The value lives in each backend's own layout (on etcd, concurrency.Election's).
// docs/election.md has the details.
package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// Leadership is one term of a leader: the lease on the election's lock.
type Leadership struct {
	name  string
	lease *dlock.Lease

	mu    sync.Mutex
	value string
}

// Campaign blocks until this candidate leads the election name on l with
// value (stored as the lock's label: at most 128 bytes of printable UTF-8),
// or ctx ends: then the error matches dlock.ErrNotAcquired and ctx's error.
// opts are the acquire's options; value overrides a WithLabel among them.
func Campaign(ctx context.Context, l dlock.Locker, name, value string, opts ...dlock.AcquireOption) (*Leadership, error) {
	lease, err := l.Acquire(ctx, name, append(opts[:len(opts):len(opts)], dlock.WithLabel(value), dlock.WithAnnounce())...)
	if err != nil {
		return nil, fmt.Errorf("election %q: campaign: %w", name, err)
	}
	return &Leadership{name: name, value: value, lease: lease}, nil
}

// Name returns the election's name.
func (ld *Leadership) Name() string { return ld.name }

// Value returns the value this leader published (by Campaign, or the last
// Proclaim that succeeded).
func (ld *Leadership) Value() string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.value
}

// Proclaim publishes value as the leader's value for the rest of the term,
// as etcd's Election.Proclaim does. It fails with dlock.ErrLeaseLost if the
// term was lost, dlock.ErrInvalidOption for a value that cannot be stored,
// and errors.ErrUnsupported where the backend cannot relabel a held lock.
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if err := ld.lease.SetLabel(ctx, value); err != nil {
		return fmt.Errorf("election %q: proclaim: %w", ld.name, err)
	}
	ld.value = value
	return nil
}

// Token returns the term's fencing token: strictly greater than every
// earlier term's on the backends whose tokens are strict (see
// dlock.Capabilities). Pass it with every write the leader makes.
func (ld *Leadership) Token() dlock.Token { return ld.lease.Token() }

// Lease returns the lease behind the term, for fencing guards and Do-style
// helpers that take one.
func (ld *Leadership) Lease() *dlock.Lease { return ld.lease }

// Done is closed when the term ends: resigned, or lost (Err says which).
func (ld *Leadership) Done() <-chan struct{} { return ld.lease.Done() }

// Err is nil while this candidate leads; afterwards an error matching
// dlock.ErrReleased (resigned) or dlock.ErrLeaseLost (lost: expired,
// broken, or the backend reported it gone).
func (ld *Leadership) Err() error { return ld.lease.Err() }

// Resign ends the term and lets the next candidate lead. It reports an error
// matching dlock.ErrLeaseLost if the term had already been lost.
func (ld *Leadership) Resign(ctx context.Context) error {
	if err := ld.lease.Release(ctx); err != nil {
		return fmt.Errorf("election %q: resign: %w", ld.name, err)
	}
	return nil
}

// Info is who leads an election.
type Info struct {
	// Name is the election's name.
	Name string
	// Led reports whether a candidate leads.
	Led bool
	// Value is the leader's published value.
	Value string
	// Token is the leader's fencing token, 0 where the backend cannot tell
	// (Redlock; PostgreSQL with tokens=sequence).
	Token uint64
	// Expires is when the server ends the term unless the leader renews it;
	// zero where the backend holds it for a session (ZooKeeper, PostgreSQL).
	Expires time.Time
}

// Leader reports who leads the election name on l now.
func Leader(ctx context.Context, l dlock.Locker, name string) (Info, error) {
	li, err := dlock.Inspect(ctx, l, name)
	if err != nil {
		return Info{Name: name}, fmt.Errorf("election %q: leader: %w", name, err)
	}
	return infoOf(name, li), nil
}

func infoOf(name string, li dlock.LockInfo) Info {
	if !li.Held {
		return Info{Name: name}
	}
	return Info{Name: name, Led: true, Value: li.Label, Token: li.Token, Expires: li.Expires}
}

// followUpDelay is the first of the re-reads after a pushed change that
// found nobody leading (then twice, four times as long).
const followUpDelay = 5 * time.Millisecond

// DefaultObserveInterval is how often Observe reads the leader unless
// WithInterval says otherwise.
const DefaultObserveInterval = time.Second

// ObserveOption configures Observe.
type ObserveOption func(*observeSettings)

type observeSettings struct{ every time.Duration }

// WithInterval sets how often Observe reads the leader. Default
// DefaultObserveInterval (1s); it must be positive.
func WithInterval(d time.Duration) ObserveOption {
	return func(s *observeSettings) { s.every = d }
}

// ErrInvalidInterval is returned by Observe for an interval that is not
// positive.
var ErrInvalidInterval = errors.New("election: observe interval must be positive")

// Observe sends who leads the election name on l at once and at each change
// (pushed where the backend pushes, read every WithInterval), never a term
// after a later one, until ctx ends; then it closes the channel. Read errors
// are skipped; a reader that falls behind sees only the newest leader.
func Observe(ctx context.Context, l dlock.Locker, name string, opts ...ObserveOption) (<-chan Info, error) {
	s := observeSettings{every: DefaultObserveInterval}
	for _, o := range opts {
		o(&s)
	}
	if s.every <= 0 {
		return nil, fmt.Errorf("%w, got %v", ErrInvalidInterval, s.every)
	}
	out := make(chan Info)
	go func() { // owned by the caller's ctx: it returns when ctx ends
		defer close(out)
		var last Info
		var top uint64 // the highest token sent
		sent := false
		worth := func(cur Info) bool {
			switch {
			case !sent:
				return true
			case !cur.Led:
				return last.Led
			case cur.Token != 0:
				// A later term, or the same term's new value (Proclaim).
				return cur.Token > top || cur.Token == top && last.Led && cur.Value != last.Value
			default: // the backend cannot tell tokens: a change of value
				return !last.Led || cur.Value != last.Value
			}
		}
		// Where the backend pushes changes, a change triggers a read; the
		// interval's reads stay as the fallback. A release is often pushed
		// without the grant that follows it: a read that finds nobody
		// leading after a change is repeated a few times shortly after.
		kick := make(chan struct{}, 1)
		watching := dlock.Watch(ctx, l, name, func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		}) == nil
		tick := time.NewTicker(s.every)
		defer tick.Stop()
		follow := time.NewTimer(time.Hour)
		follow.Stop()
		defer follow.Stop()
		followUps := 0 // reads left after a change that found nobody leading
		for {
			if cur, err := Leader(ctx, l, name); err == nil {
				if worth(cur) {
					select {
					case out <- cur:
						last, sent = cur, true
						top = max(top, cur.Token)
					case <-ctx.Done():
						return
					}
				}
				if cur.Led {
					followUps = 0
				}
			}
			if followUps > 0 {
				follow.Reset(followUpDelay << (3 - followUps))
				followUps--
			}
			select {
			case <-tick.C:
			case <-kick:
				if watching {
					followUps = 3
				}
			case <-follow.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// ErrStop, returned by Config.OnStartedLeading, ends Run after the term: Run
// resigns and returns nil instead of campaigning again.
var ErrStop = errors.New("election: stop")

// Config is everything Run needs, as client-go's LeaderElectionConfig is.
// Run checks it before it campaigns; an invalid Config is an error matching
// ErrInvalidConfig.
type Config struct {
	// Locker is the Locker the election runs on. Required.
	Locker dlock.Locker

	// Name is the election's name: its lock's key. Required; a key that
	// cannot name a lock fails the first campaign (dlock.ErrInvalidKey),
	// which ends Run.
	Name string

	// Value is what this candidate publishes while it leads (see Campaign):
	// the lock's label, so dlock.WithLabel's rules apply, and a value that
	// breaks them fails the first campaign (dlock.ErrInvalidOption). Optional:
	// "" publishes none.
	Value string

	// OnStartedLeading is the work of a term: Run calls it each time this
	// candidate becomes leader, with a ctx that is cancelled, with the term's
	// error as its cause (context.Cause matches dlock.ErrLeaseLost), the
	// moment leadership is lost. When it returns, Run resigns and campaigns
	// again; if it returns ErrStop, Run returns nil instead. Required.
	OnStartedLeading func(ctx context.Context, ld *Leadership) error

	// OnStoppedLeading, if not nil, is called when a term ends, with why: nil
	// if OnStartedLeading returned nil (or ErrStop) and the term was
	// resigned, else OnStartedLeading's error, joined with the term's
	// (matching dlock.ErrLeaseLost) if it was lost.
	OnStoppedLeading func(ld *Leadership, err error)
	// OnNewLeader is called from a goroutine of Run's, as client-go's is,
	// with each leader Observe reports (Info.Led false while nobody leads),
	// until Run returns.
	OnNewLeader func(Info)

	// ObserveInterval is how often OnNewLeader's Observe reads the leader
	// (see WithInterval). Zero means DefaultObserveInterval (1s); negative
	// is invalid.
	ObserveInterval time.Duration

	// AcquireOptions are the options of every campaign's acquire
	// (dlock.WithTTL, say); a dlock.WithLabel among them is overridden by
	// Value. Optional.
	AcquireOptions []dlock.AcquireOption
}

// ErrInvalidConfig means Run was given a Config it cannot run: no Locker,
// no Name, no OnStartedLeading, or a negative ObserveInterval. The error
// names the field and also matches dlock.ErrInvalidOption.
var ErrInvalidConfig = errors.New("election: invalid config")

// check returns nil if Run can run c, else an error matching
// ErrInvalidConfig that names the field.
func (c *Config) check() error {
	var why string
	switch {
	case c.Locker == nil:
		why = "Locker is nil"
	case c.Name == "":
		why = "Name is empty"
	case c.OnStartedLeading == nil:
		why = "OnStartedLeading is nil"
	case c.ObserveInterval < 0:
		return fmt.Errorf("%w: %w: %w: ObserveInterval is %v", ErrInvalidConfig, dlock.ErrInvalidOption, ErrInvalidInterval, c.ObserveInterval)
	default:
		return nil
	}
	return fmt.Errorf("%w: %w: %s", ErrInvalidConfig, dlock.ErrInvalidOption, why)
}

// Run campaigns for the election cfg.Name on cfg.Locker with cfg.Value, and
// while leading runs cfg.OnStartedLeading. When that returns, Run resigns
// (leadership is released, not left to expire, as client-go's
// ReleaseOnCancel) and campaigns again, until ctx ends (Run then returns
// ctx's error) or OnStartedLeading returns ErrStop (Run returns nil). Any
// other error from OnStartedLeading is passed to OnStoppedLeading and Run
// campaigns again; an error from Campaign that is not ctx's ends Run. An
// invalid cfg is an error matching ErrInvalidConfig, before any campaign.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	l, name, opts := cfg.Locker, cfg.Name, cfg.AcquireOptions
	if cfg.OnNewLeader != nil {
		every := cfg.ObserveInterval
		if every == 0 {
			every = DefaultObserveInterval
		}
		octx, stop := context.WithCancel(ctx)
		seen, err := Observe(octx, l, name, WithInterval(every))
		if err != nil {
			stop()
			return err
		}
		done := make(chan struct{})
		go func() { // owned by Run: ends when Run returns
			defer close(done)
			for in := range seen {
				cfg.OnNewLeader(in)
			}
		}()
		defer func() { stop(); <-done }()
	}
	for {
		ld, err := Campaign(ctx, l, name, cfg.Value, opts...)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		tctx, cancel := context.WithCancelCause(ctx)
		stop := make(chan struct{})
		watched := make(chan struct{})
		go func() { // owned by this term: ends when the term or its work does
			defer close(watched)
			select {
			case <-ld.Done():
				cancel(ld.Err())
			case <-stop:
			}
		}()
		fnErr := cfg.OnStartedLeading(tctx, ld)
		close(stop)
		<-watched
		cancel(nil)
		lostErr := ld.Err()
		resignErr := ld.Resign(context.WithoutCancel(ctx))
		why := fnErr
		if errors.Is(why, ErrStop) {
			why = nil
		}
		switch {
		case lostErr != nil && !errors.Is(lostErr, dlock.ErrReleased):
			why = errors.Join(why, lostErr) // lost while the work ran
		case resignErr != nil && !errors.Is(resignErr, dlock.ErrReleased):
			why = errors.Join(why, resignErr)
		}
		if cfg.OnStoppedLeading != nil {
			cfg.OnStoppedLeading(ld, why)
		}
		switch {
		case errors.Is(fnErr, ErrStop):
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
}
