package scheduletest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/schedule"
)

// testRunOncePerRun: the first node to call Run for a run runs it; a node
// that comes after it finished (a clock behind, say) finds the record and
// does not, even after the first node closed its Locker; the next run runs.
func testRunOncePerRun(t *testing.T, dsn string) {
	ctx := testCtx(t, 30*time.Second)
	a, b := open(t, dsn), open(t, dsn)
	job := schedule.Job{Name: "report", AtMost: 5 * time.Second, Retention: time.Minute}
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	var runs atomic.Int32
	fn := func(context.Context, *dlock.Lease) error { runs.Add(1); return nil }

	r, err := schedule.Run(ctx, a, job, at, fn)
	if err != nil || r.Status != schedule.Ran || r.Token == 0 {
		t.Fatalf("first Run: %+v, %v; want Ran with a token", r, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	r2, err := schedule.Run(ctx, b, job, at, fn)
	if err != nil || r2.Status != schedule.Done || r2.Token != r.Token {
		t.Fatalf("second Run of the same run, after the first node closed: %+v, %v; want Done with token %v", r2, err, r.Token)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the run ran %d times, want 1", n)
	}
	r3, err := schedule.Run(ctx, b, job, at.Add(time.Hour), fn)
	if err != nil || r3.Status != schedule.Ran || r3.Token <= r.Token {
		t.Fatalf("Run of the next run: %+v, %v; want Ran with a token above %v", r3, err, r.Token)
	}
}

// testAtLeastKeepsOthersOut: a 50 ms run keeps every other node from
// starting the job for AtLeast after its start, by the backend's clock,
// whatever the clock of the node that ran it said: Lock fails meanwhile,
// Run waits for the hold.
func testAtLeastKeepsOthersOut(t *testing.T, dsn string) {
	ctx := testCtx(t, 30*time.Second)
	a, b := open(t, dsn), open(t, dsn)
	const atLeast = 1500 * time.Millisecond
	job := schedule.Job{Name: "sweep", AtMost: 5 * time.Second, AtLeast: atLeast}
	start := time.Now()
	lease, err := schedule.Lock(ctx, a, job)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the job's work
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var bStart time.Time
	for {
		bStart = time.Now()
		lb, err := schedule.Lock(ctx, b, job)
		if err == nil {
			if held := time.Since(start); held < atLeast {
				t.Fatalf("another node took the job %v after a 50 ms run started; want ≥ AtLeast (%v)", held, atLeast)
			}
			_ = lb.Release(ctx)
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the job never became free after AtLeast: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// b's run holds the job for AtLeast in turn. Run of another run
	// meanwhile waits for the hold to expire (up to RetryWithin), and
	// reports InProgress if it does not in time.
	short := job
	short.RetryWithin = 100 * time.Millisecond
	r, err := schedule.Run(ctx, a, short, time.Now(), func(context.Context, *dlock.Lease) error { return nil })
	if err != nil || r.Status != schedule.InProgress {
		t.Fatalf("Run within AtLeast of another run's start, RetryWithin 100ms: %+v, %v; want InProgress", r, err)
	}
	var began time.Time
	r, err = schedule.Run(ctx, a, job, time.Now().Add(time.Hour), func(context.Context, *dlock.Lease) error { began = time.Now(); return nil })
	if err != nil || r.Status != schedule.Ran {
		t.Fatalf("Run within AtLeast of another run's start: %+v, %v; want Ran once the hold expired", r, err)
	}
	if d := began.Sub(bStart); d < atLeast {
		t.Fatalf("a run started %v after the previous one; want ≥ AtLeast (%v)", d, atLeast)
	}
}

// testAtMostBreaksHungJob: a job that hangs past AtMost loses its lease: its
// ctx is cancelled with ErrLeaseLost as the cause, the next run gets a
// higher token, and the hung job's late write is refused by the token.
func testAtMostBreaksHungJob(t *testing.T, dsn string) {
	ctx := testCtx(t, 30*time.Second)
	a, b := open(t, dsn), open(t, dsn)
	const atMost = 800 * time.Millisecond
	job := schedule.Job{Name: "hung", AtMost: atMost}
	var guard fencing.Guard
	at := time.Now().Truncate(time.Second)
	next := make(chan dlock.Token, 1)
	lateWrite := make(chan error, 1)
	start := time.Now()
	r, err := schedule.Run(ctx, a, job, at, func(fctx context.Context, lease *dlock.Lease) error {
		<-fctx.Done()
		if !errors.Is(context.Cause(fctx), dlock.ErrLeaseLost) {
			t.Errorf("the hung job's ctx ended with %v, want the cause ErrLeaseLost", context.Cause(fctx))
		}
		// etcd counts TTLs in whole seconds, 2 s at least.
		if took, bound := time.Since(start), max(atMost, 2*time.Second)+time.Second; took > bound {
			t.Errorf("the hung job was broken after %v, want about AtMost (%v, at most %v)", took, atMost, bound)
		}
		// The next run takes the job and writes; then the hung job's write comes late.
		r2, err := schedule.Run(ctx, b, job, at.Add(time.Minute), func(_ context.Context, l2 *dlock.Lease) error {
			next <- l2.Token()
			return guard.Do("report", l2.Token(), func() error { return nil })
		})
		if err != nil || r2.Status != schedule.Ran {
			t.Errorf("next run after the hung one was broken: %+v, %v", r2, err)
		}
		lateWrite <- guard.Do("report", lease.Token(), func() error { return nil })
		return context.Cause(fctx)
	})
	if r.Status != schedule.Ran || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Run of the hung job: %+v, %v; want Ran with ErrLeaseLost", r, err)
	}
	if tok := <-next; tok <= r.Token {
		t.Fatalf("next run's token %v, want above the hung run's %v", tok, r.Token)
	}
	if err := <-lateWrite; !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("the hung job's late write: %v, want ErrStaleToken", err)
	}
}

// testNodeDiesMidRun: a node that dies mid-run (here it hangs and its
// lease runs out: AtMost). NotRepeated: the run is claimed before it
// starts, and not made again, by anyone. RetryLost: a node waiting for the run makes it once the dead
// holder's lease is lost, and only then.
func testNodeDiesMidRun(t *testing.T, dsn string) {
	for _, mode := range []schedule.Mode{schedule.NotRepeated, schedule.RetryLost} {
		ctx := testCtx(t, 30*time.Second)
		a, b := open(t, dsn), open(t, dsn)
		const atMost = 700 * time.Millisecond
		job := schedule.Job{Name: "dies" + map[schedule.Mode]string{schedule.NotRepeated: "-nr", schedule.RetryLost: "-rl"}[mode],
			AtMost: atMost, Mode: mode, RetryWithin: 3 * time.Second}
		at := time.Now().Truncate(time.Second)
		started := make(chan struct{})
		dead := make(chan struct{})
		type outcome struct {
			r   schedule.Result
			err error
		}
		first := make(chan outcome, 1)
		go func() {
			r, err := schedule.Run(ctx, a, job, at, func(fctx context.Context, _ *dlock.Lease) error {
				close(started)
				<-fctx.Done() // hangs until its lease is lost: a dead node's lease runs out the same way
				close(dead)
				return context.Cause(fctx)
			})
			first <- outcome{r, err}
		}()
		<-started
		var ran atomic.Bool
		var diedFirst bool
		r, err := schedule.Run(ctx, b, job, at, func(context.Context, *dlock.Lease) error {
			select {
			case <-dead:
				diedFirst = true
			default:
			}
			ran.Store(true)
			return nil
		})
		o := <-first
		if !errors.Is(o.err, dlock.ErrLeaseLost) {
			t.Errorf("%v: the dying run: %+v, %v; want ErrLeaseLost", mode, o.r, o.err)
		}
		switch mode {
		case schedule.NotRepeated:
			if err != nil || r.Status != schedule.Done || ran.Load() {
				t.Errorf("NotRepeated: the second node during the run: %+v, %v (ran %v); want Done (claimed), not run", r, err, ran.Load())
			}
			r, err = schedule.Run(ctx, b, job, at, func(context.Context, *dlock.Lease) error { ran.Store(true); return nil })
			if err != nil || r.Status != schedule.Done || ran.Load() {
				t.Errorf("NotRepeated: after the holder died: %+v, %v (ran %v); want Done, not repeated", r, err, ran.Load())
			}
		case schedule.RetryLost:
			if err != nil || r.Status != schedule.Ran || !ran.Load() || !diedFirst {
				t.Errorf("RetryLost: the waiting node: %+v, %v (ran %v, after the holder was lost %v); want Ran after the loss", r, err, ran.Load(), diedFirst)
			}
			r, err = schedule.Run(ctx, a, job, at, func(context.Context, *dlock.Lease) error { t.Error("ran a third time"); return nil })
			if err != nil || r.Status != schedule.Done {
				t.Errorf("RetryLost: after the retry completed: %+v, %v; want Done", r, err)
			}
		}
	}
}

// testEveryWaitsOutABusyJob: while another node holds the job's lease for
// three times RetryWithin, the first run due reports InProgress; Every calls
// it again, not the next one, and once the lease is free it makes every run
// from that first one on, none skipped (a run skipped after an InProgress
// shows as a gap, or as an InProgress for a later run).
func testEveryWaitsOutABusyJob(t *testing.T, dsn string) {
	const (
		period = 200 * time.Millisecond
		within = 300 * time.Millisecond
	)
	ctx := testCtx(t, 30*time.Second)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a, b := open(t, dsn), open(t, dsn)
	job := schedule.Job{Name: "every-busy", AtMost: 5 * time.Second, RetryWithin: within, Retention: time.Minute}
	blocker, err := b.Acquire(ctx, "schedule/job/"+job.Name, dlock.WithLabel("another run=19700101T000000.000000000Z"))
	if err != nil {
		t.Fatal(err)
	}
	released := time.AfterFunc(3*within, func() { _ = blocker.Release(context.Background()) })
	defer released.Stop()

	var (
		first time.Time
		ran   []time.Time
		busy  int
	)
	err = schedule.Every(ctx, a, job, period,
		func(fctx context.Context, _ *dlock.Lease) error {
			at, _ := schedule.ScheduledAt(fctx)
			ran = append(ran, at)
			return nil
		},
		func(at time.Time, r schedule.Result, err error) {
			if err != nil {
				t.Errorf("the run at %v: %v", at, err)
			}
			if first.IsZero() {
				first = at
			}
			if r.Status == schedule.InProgress {
				busy++
				if !at.Equal(first) {
					t.Errorf("InProgress for the run at %v, after the first (%v): Every moved on", at.Format("15:04:05.000"), first.Format("15:04:05.000"))
				}
			}
			if len(ran) >= 5 {
				cancel()
			}
		})
	if len(ran) < 5 {
		t.Fatalf("Every made %d runs (%v); want 5", len(ran), err)
	}
	if busy == 0 {
		t.Fatal("the first run was never reported InProgress: the other node's lease did not keep Every waiting, and the test proves nothing")
	}
	for i, at := range ran {
		if want := first.Add(time.Duration(i) * period); !at.Equal(want) {
			t.Fatalf("run %d is at %v, want %v: runs skipped while the job was busy (made: %v)", i, at.Format("15:04:05.000"), want.Format("15:04:05.000"), ran)
		}
	}
}
