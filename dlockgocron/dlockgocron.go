// Package dlockgocron plugs dlock into gocron v2 (github.com/go-co-op/gocron/v2):
// a [Locker] that makes each run of a job once across every scheduler that
// shares a backend, with package schedule's record of the run, and an
// [Elector] backed by package election. docs/schedule.md has the guarantees
// and a setup end to end.
package dlockgocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/schedule"
)

// ErrNotRun is matched (errors.Is) by Lock's error when this scheduler is
// not to run the job now: another ran it (the run's record says so), is
// running it, or ran the job less than AtLeast ago. gocron then skips the
// run here.
var ErrNotRun = errors.New("dlockgocron: not this scheduler's run")

// Locker is a gocron.Locker over a dlock.Locker: give it to
// gocron.WithDistributedLocker or gocron.WithDistributedJobLocker.
type Locker struct {
	locker dlock.Locker
	job    schedule.Job
	period time.Duration
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a gocron.Locker over l. job gives every job's AtMost,
// AtLeast, Mode, Retention and Label; its Name is replaced by the key gocron
// passes, the job's name.
//
// period is the jobs' period. gocron does not tell a Locker which run it
// locks, so Lock names the run by the multiple of period (counted from the
// Unix epoch, as schedule.Every counts) nearest the local clock: every scheduler whose clock is less than period/2 off names the
// same run, and the run's record turns away those that come late
// (schedule.Begin). Start duration jobs on a multiple of their period
// (gocron.WithStartAt). With period 0, Lock is schedule.Lock: the job's
// lease and its AtLeast hold only, ShedLock's guarantee, which a clock
// skewed by more than AtLeast defeats.
func NewLocker(l dlock.Locker, job schedule.Job, period time.Duration) (*Locker, error) {
	if l == nil || period < 0 {
		return nil, fmt.Errorf("dlockgocron: %w: a Locker and a period ≥ 0 are required", schedule.ErrInvalidJob)
	}
	check := job
	check.Name = "check"
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("dlockgocron: %w", err)
	}
	return &Locker{locker: l, job: job, period: period}, nil
}

// Lock claims the run of the job named key that is due now. It returns an
// error matching ErrNotRun if this scheduler is not to run it, or the
// backend's error.
func (x *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	job := x.job
	job.Name = key
	if x.period == 0 {
		lease, err := schedule.Lock(ctx, x.locker, job)
		if errors.Is(err, dlock.ErrNotAcquired) {
			return nil, fmt.Errorf("%w: %w", ErrNotRun, err)
		}
		if err != nil {
			return nil, err
		}
		return leaseLock{lease}, nil
	}
	at := runAt(time.Now(), x.period)
	c, r, err := schedule.Begin(ctx, x.locker, job, at)
	if c == nil {
		if err == nil {
			err = fmt.Errorf("%w: the run at %v is %v", ErrNotRun, at.UTC().Format(time.RFC3339Nano), r.Status)
		}
		return nil, err
	}
	return claimLock{c}, nil
}

// runAt names the run due at now: the multiple of period, counted from the
// Unix epoch as schedule.Every counts, nearest to now.
func runAt(now time.Time, period time.Duration) time.Time {
	epoch := time.Unix(0, 0)
	return epoch.Add(now.Sub(epoch).Round(period)).In(now.Location())
}

// leaseLock unlocks by releasing the job's lease (its AtLeast hold stays).
type leaseLock struct{ lease *dlock.Lease }

func (k leaseLock) Unlock(ctx context.Context) error { return k.lease.Release(ctx) }

// claimLock ends a claimed run: gocron does not pass the job's error to
// Unlock, so in Mode RetryLost every run that gets here is recorded.
type claimLock struct{ c *schedule.Claim }

func (k claimLock) Unlock(ctx context.Context) error {
	_, err := k.c.End(ctx, nil)
	return err
}

// ErrNotLeader is matched (errors.Is) by IsLeader's error when this
// scheduler does not lead the election.
var ErrNotLeader = errors.New("dlockgocron: not the leader")

// Elector is a gocron.Elector backed by package election: give it to
// gocron.WithDistributedElector. It campaigns from NewElector until Close.
type Elector struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's, once done is closed

	mu     sync.Mutex
	leader *election.Leadership // nil while this scheduler does not lead
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning in the election name on l, with value as
// what this scheduler publishes while it leads (see election.Config), until
// Close. opts are the campaigns' acquire options (dlock.WithTTL, say).
func NewElector(l dlock.Locker, name, value string, opts ...dlock.AcquireOption) (*Elector, error) {
	if l == nil || name == "" {
		return nil, fmt.Errorf("dlockgocron: %w: a Locker and a name are required", election.ErrInvalidConfig)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{cancel: cancel, done: make(chan struct{})}
	cfg := election.Config{
		Locker: l, Name: name, Value: value, AcquireOptions: opts,
		OnStartedLeading: func(ctx context.Context, ld *election.Leadership) error {
			e.mu.Lock()
			e.leader = ld
			e.mu.Unlock()
			<-ctx.Done()
			e.mu.Lock()
			e.leader = nil
			e.mu.Unlock()
			return nil
		},
	}
	go func() {
		defer close(e.done)
		e.err = election.Run(ctx, cfg)
	}()
	return e, nil
}

// IsLeader returns nil if this scheduler leads the election now (its
// leadership's lease is held), else an error matching ErrNotLeader.
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	ld := e.leader
	e.mu.Unlock()
	if ld == nil {
		return ErrNotLeader
	}
	if err := ld.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return nil
}

// Leadership returns this scheduler's leadership while it leads (its Token
// fences the jobs' writes), nil otherwise.
func (e *Elector) Leadership() *election.Leadership {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader
}

// Close stops campaigning, resigns if this scheduler leads, and waits for
// the campaign to end. It returns the campaign's error if it ended for
// another reason than Close.
func (e *Elector) Close() error {
	e.cancel()
	<-e.done
	if errors.Is(e.err, context.Canceled) {
		return nil
	}
	return e.err
}
