package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// DefaultRetention is how long a run's record, or Once's, is kept unless
// Job.Retention or WithRetention says otherwise.
const DefaultRetention = 24 * time.Hour

// ErrInvalidJob is matched (errors.Is) by the error for a Job or an option
// that makes no sense: no name, AtMost ≤ 0, AtLeast > AtMost, a retention
// shorter than AtMost.
var ErrInvalidJob = errors.New("invalid job")

// Mode says what becomes of a run whose node dies, or whose job hangs past
// AtMost, before the job returns.
type Mode int

const (
	// NotRepeated records the run before the job starts: a run starts at
	// most once, and one whose node dies is not repeated. The default.
	NotRepeated Mode = iota

	// RetryLost records the run once the job returns nil: a run whose job
	// fails, or whose lease is lost (its node died, or it hung past
	// AtMost), is run again by a node that found it in progress and waited
	// for it (Job.RetryWithin). A run is then completed at most once, but
	// may start more than once.
	RetryLost
)

// Job is a scheduled job: its name across the fleet, its holds, and what
// becomes of a run whose node dies.
type Job struct {
	// Name identifies the job on every node. Its keys are
	// "schedule/job/"+Name, "schedule/hold/"+Name and
	// "schedule/run/"+Name+"/"+time, so no job's Name may be another's
	// followed by "/". Required.
	Name string

	// AtMost is ShedLock's lockAtMostFor: the job's lease has this TTL and is
	// not renewed, so a job that runs longer loses its lease (its ctx is
	// cancelled; its token is superseded by the next run's), and the job is
	// free again at most AtMost after a node that died took it. Required.
	AtMost time.Duration

	// AtLeast is ShedLock's lockAtLeastFor: no other run of the job starts
	// within AtLeast of a run's start, however soon the run finishes, by
	// the backend's clock. 0 (the default): none. At most AtMost.
	AtLeast time.Duration

	// Mode says whether a run whose node dies is repeated. Default
	// NotRepeated.
	Mode Mode

	// Retention is how long a run's record is kept: it must exceed the
	// period plus the largest clock skew between nodes, or a node far
	// enough behind runs the run again. Default DefaultRetention (24h).
	Retention time.Duration

	// RetryWithin bounds how long Run waits for the job's lease held by
	// another node (which may be making this run: in Mode RetryLost, the
	// wait ends when it completes or its lease is lost), and for an earlier
	// run's AtLeast hold. Default AtMost.
	RetryWithin time.Duration

	// Label is stored with the job's lease, for Inspect and `dlock ls`.
	// Default dlock.DefaultLabel.
	Label string
}

// Validate returns nil if Run can run j, else an error matching
// ErrInvalidJob that says why.
func (j Job) Validate() error {
	_, err := j.check()
	return err
}

// check returns j with its defaults set, or an error matching
// ErrInvalidJob.
func (j Job) check() (Job, error) {
	switch {
	case j.Name == "":
		return j, fmt.Errorf("%w: no name", ErrInvalidJob)
	case j.AtMost <= 0:
		return j, fmt.Errorf("%w: AtMost must be > 0, got %v", ErrInvalidJob, j.AtMost)
	case j.AtLeast < 0 || j.AtLeast > j.AtMost:
		return j, fmt.Errorf("%w: AtLeast must be between 0 and AtMost (%v), got %v", ErrInvalidJob, j.AtMost, j.AtLeast)
	case j.Mode != NotRepeated && j.Mode != RetryLost:
		return j, fmt.Errorf("%w: unknown mode %d", ErrInvalidJob, j.Mode)
	case j.Retention < 0 || j.RetryWithin < 0:
		return j, fmt.Errorf("%w: negative Retention or RetryWithin", ErrInvalidJob)
	}
	if j.Retention == 0 {
		j.Retention = DefaultRetention
	}
	if j.Retention < j.AtMost {
		return j, fmt.Errorf("%w: Retention (%v) is shorter than AtMost (%v)", ErrInvalidJob, j.Retention, j.AtMost)
	}
	if j.RetryWithin == 0 {
		j.RetryWithin = j.AtMost
	}
	if j.Label == "" {
		j.Label = dlock.DefaultLabel
	}
	return j, nil
}

func (j Job) jobKey() string  { return "schedule/job/" + j.Name }
func (j Job) holdKey() string { return "schedule/hold/" + j.Name }

// runID names the run scheduled at at: the time in UTC, to the nanosecond.
func runID(at time.Time) string { return at.UTC().Format("20060102T150405.000000000Z") }

func (j Job) runKey(at time.Time) string { return "schedule/run/" + j.Name + "/" + runID(at) }

// leaseOpts are the options of the job's lease for run id.
func (j Job) leaseOpts(id string) []dlock.AcquireOption {
	label := j.Label
	if id != "" {
		if l := label + " run=" + id; len(l) <= 128 {
			label = l
		}
	}
	return []dlock.AcquireOption{dlock.WithTTL(j.AtMost), dlock.WithAutoRenew(false), dlock.WithLabel(label)}
}

// Run runs the run of job scheduled at at, unless a node has already run it
// or is running it: call it on every node when the run falls due, with the
// run's scheduled time (not the time of the call), and the first call
// anywhere runs fn; the others return Done or InProgress without running it.
// Two calls make one run when they pass the same at, to the nanosecond.
//
// fn runs under the job's lease, whose TTL is AtMost (see Func). A call
// that finds the job's lease held (by another run, or by this run in Mode
// RetryLost) waits for it up to RetryWithin, then looks for the record
// again; one that finds an earlier run's AtLeast hold waits for it to
// expire, up to RetryWithin too. Run returns Ran with fn's error (Redo
// instead in Mode RetryLost, where nothing is then recorded); Redo with an
// error matching dlock.ErrLeaseLost if the lease was lost before the record
// was written; Done if the run's record was found; InProgress if the waits
// ran out. Errors of the backend are returned as they are, with a zero
// Result.
func Run(ctx context.Context, l dlock.Locker, job Job, at time.Time, fn Func) (Result, error) {
	r, _, err := run(ctx, l, job, at, fn)
	return r, err
}

// run is Run; busy reports an InProgress because the job's lease stayed
// held all through RetryWithin (not an AtLeast hold).
func run(ctx context.Context, l dlock.Locker, job Job, at time.Time, fn Func) (Result, bool, error) {
	c, r, busy, err := begin(ctx, l, job, at)
	if c == nil {
		return r, busy, err
	}
	fnErr := runUnder(context.WithValue(ctx, atKey{}, at), c.lease, fn)
	r, err = c.End(ctx, fnErr)
	return r, false, err
}

// Claim is a run that Begin claimed: the caller runs the job under its
// Lease, then calls End.
type Claim struct {
	l      dlock.Locker
	job    Job
	at     time.Time
	lease  *dlock.Lease
	ended  bool
	result Result
}

// Lease returns the job's lease for the run: its Token fences the job's
// writes, its Done is closed when the run's AtMost runs out.
func (c *Claim) Lease() *dlock.Lease { return c.lease }

// Begin is Run split in two, for schedulers that lock and unlock around a
// job they run themselves (gocron's Locker): it claims the run of job
// scheduled at at as Run does and, if this call is to run it, returns a
// Claim (and Result Ran). Otherwise the Claim is nil and the Result and
// error are Run's.
func Begin(ctx context.Context, l dlock.Locker, job Job, at time.Time) (*Claim, Result, error) {
	c, r, _, err := begin(ctx, l, job, at)
	return c, r, err
}

// begin is Begin; busy reports an InProgress because the job's lease stayed
// held all through RetryWithin (not an earlier run's AtLeast hold).
func begin(ctx context.Context, l dlock.Locker, job Job, at time.Time) (*Claim, Result, bool, error) {
	job, err := job.check()
	if err != nil {
		return nil, Result{}, false, errorf("run", job.Name, err)
	}
	id, runKey := runID(at), job.runKey(at)
	if done, tok, err := recorded(ctx, l, runKey); err != nil {
		return nil, Result{}, false, errorf("run", job.Name, err)
	} else if done {
		return nil, Result{Status: Done, Token: tok}, false, nil
	}

	// The job's lease is held by another run, or by this one on another
	// node: wait for it (a run of this job that found the lease busy is
	// never skipped for that alone), then look for the record again.
	wctx, cancel := context.WithTimeout(ctx, job.RetryWithin)
	lease, err := l.Acquire(wctx, job.jobKey(), job.leaseOpts(id)...)
	cancel()
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		return nil, Result{Status: InProgress, Holder: holderOf(ctx, l, job.jobKey())}, true, nil
	}
	if err != nil {
		return nil, Result{}, false, errorf("run", job.Name, err)
	}
	release := func() { _ = lease.Release(context.WithoutCancel(ctx)) }

	// Under the job's lease: the record, if any, was written before the
	// lease was granted.
	if done, tok, err := recorded(ctx, l, runKey); err != nil {
		release()
		return nil, Result{}, false, errorf("run", job.Name, err)
	} else if done {
		release()
		return nil, Result{Status: Done, Token: tok}, false, nil
	}
	if job.AtLeast > 0 {
		if busy, err := hold(ctx, l, job, id, job.RetryWithin); err != nil || busy != "" {
			release()
			if err != nil {
				return nil, Result{}, false, errorf("run", job.Name, err)
			}
			return nil, Result{Status: InProgress, Holder: busy}, false, nil
		}
	}
	tok := lease.Token()
	if job.Mode == NotRepeated {
		err := writeRecord(ctx, l, runKey, recordLabel("claimed", tok), job.Retention, lease)
		switch {
		case errors.Is(err, errRecorded):
			release()
			return nil, Result{Status: Done, Token: tok}, false, nil
		case errors.Is(err, dlock.ErrLeaseLost):
			release()
			return nil, Result{Status: Redo, Token: tok}, false, errorf("run", job.Name, err)
		case err != nil:
			release()
			return nil, Result{}, false, errorf("run", job.Name, err)
		}
	}
	c := &Claim{l: l, job: job, at: at, lease: lease}
	return c, Result{Status: Ran, Token: tok}, false, nil
}

// End ends the run with the job's error: in Mode RetryLost it records the
// run if jobErr is nil and the lease is still held, then it releases the
// lease. It returns what Run would have: Ran with jobErr (Redo in Mode
// RetryLost if jobErr is not nil or the run could not be recorded). Calls
// after the first return the first's result.
func (c *Claim) End(ctx context.Context, jobErr error) (Result, error) {
	if c.ended {
		return c.result, jobErr
	}
	c.ended = true
	defer func() { _ = c.lease.Release(context.WithoutCancel(ctx)) }()
	tok := c.lease.Token()
	c.result = Result{Status: Ran, Token: tok}
	if jobErr != nil {
		if c.job.Mode == RetryLost {
			c.result.Status = Redo
		}
		return c.result, jobErr
	}
	if c.job.Mode == NotRepeated {
		return c.result, nil
	}
	err := writeRecord(ctx, c.l, c.job.runKey(c.at), recordLabel("done", tok), c.job.Retention, c.lease)
	switch {
	case errors.Is(err, errRecorded):
		// Written by a holder whose lease this one superseded: both ran.
		return c.result, errorf("run", c.job.Name, fmt.Errorf("the run was recorded by another holder meanwhile: %w", err))
	case err != nil:
		c.result.Status = Redo
		return c.result, errorf("run", c.job.Name, fmt.Errorf("the run completed but could not be recorded: %w", err))
	}
	return c.result, nil
}

// atKey is the context key of a run's scheduled time.
type atKey struct{}

// ScheduledAt returns the scheduled time of the run whose Func was given
// ctx by Run (or Every).
func ScheduledAt(ctx context.Context) (time.Time, bool) {
	at, ok := ctx.Value(atKey{}).(time.Time)
	return at, ok
}

// hold takes job's AtLeast hold for run id: a lock with TTL AtLeast, left to
// expire on its own. If another run holds it, hold waits up to wait for it
// to expire, and returns its holder's label if it does not; it returns ""
// once this run holds it, or if this run already did (a retry).
func hold(ctx context.Context, l dlock.Locker, job Job, id string, wait time.Duration) (string, error) {
	label := "run=" + id
	opts := []dlock.AcquireOption{dlock.WithTTL(job.AtLeast), dlock.WithAutoRenew(false), dlock.WithLabel(label)}
	h, err := l.TryAcquire(ctx, job.holdKey(), opts...)
	for try := 1; try < 3 && err != nil && !errors.Is(err, dlock.ErrNotAcquired) &&
		!errors.Is(err, dlock.ErrClosed) && !errors.Is(err, dlock.ErrInvalidOption) && ctx.Err() == nil; try++ {
		// A hold as short as AtLeast may reach us too late to be valid (a
		// slow reply), or meet a passing error: ask again.
		h, err = l.TryAcquire(ctx, job.holdKey(), opts...)
	}
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		holder := holderOf(ctx, l, job.holdKey())
		if holder == label {
			return "", nil // this run's own hold: a retry of it
		}
		if wait > 0 {
			wctx, cancel := context.WithTimeout(ctx, wait)
			h, err = l.Acquire(wctx, job.holdKey(), opts...)
			cancel()
		}
		if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
			if holder == "" {
				holder = "(unknown)"
			}
			return holder, nil
		}
	}
	if err != nil {
		return "", err
	}
	return "", h.Orphan(ctx)
}

// Lock takes job's lease for a run that no scheduled time identifies — the
// lock of a scheduler that asks for a job's name alone, as ShedLock and
// gocron's Locker do — and its AtLeast hold. It fails with an error matching
// dlock.ErrNotAcquired if another node holds the job or started it less than
// AtLeast ago. Release the lease when the run ends; the hold stays until
// AtLeast after the start. Without a record, Lock cannot tell a run made by
// a node whose clock is behind from the next one: prefer Run.
func Lock(ctx context.Context, l dlock.Locker, job Job) (*dlock.Lease, error) {
	job, err := job.check()
	if err != nil {
		return nil, errorf("lock", job.Name, err)
	}
	lease, err := l.TryAcquire(ctx, job.jobKey(), job.leaseOpts("")...)
	if err != nil {
		return nil, errorf("lock", job.Name, err)
	}
	if job.AtLeast > 0 {
		busy, err := hold(ctx, l, job, "lock-"+lease.Token().String(), 0)
		if err == nil && busy != "" {
			err = fmt.Errorf("%w: a run started less than %v ago (%s)", dlock.ErrNotAcquired, job.AtLeast, busy)
		}
		if err != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
			return nil, errorf("lock", job.Name, err)
		}
	}
	return lease, nil
}
