package scheduletest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
)

// testOnceStatuses: a retrying caller learns that the work completed (with
// the completing token), is in progress under another holder, or must be
// redone (its fn failed, or its lease was lost), and is never told Done for
// work that did not complete.
func testOnceStatuses(t *testing.T, dsn string) {
	ctx := testCtx(t, 30*time.Second)
	a, b := open(t, dsn), open(t, dsn)
	var runs atomic.Int32

	// Fails: Redo, nothing recorded.
	boom := errors.New("boom")
	r, err := schedule.Once(ctx, a, "payment-1", func(context.Context, *dlock.Lease) error { runs.Add(1); return boom })
	if r.Status != schedule.Redo || !errors.Is(err, boom) {
		t.Fatalf("Once whose fn fails: %+v, %v; want Redo with fn's error", r, err)
	}

	// In progress under another holder.
	inside := make(chan struct{})
	finish := make(chan struct{})
	done := make(chan schedule.Result, 1)
	go func() {
		r, err := schedule.Once(ctx, a, "payment-1", func(context.Context, *dlock.Lease) error {
			runs.Add(1)
			close(inside)
			<-finish
			return nil
		})
		if err != nil {
			t.Errorf("Once that completes: %v", err)
		}
		done <- r
	}()
	<-inside
	r, err = schedule.Once(ctx, b, "payment-1", func(context.Context, *dlock.Lease) error { t.Error("ran while in progress"); return nil })
	if err != nil || r.Status != schedule.InProgress {
		t.Fatalf("Once while another holder runs it: %+v, %v; want InProgress", r, err)
	}
	close(finish)
	first := <-done
	if first.Status != schedule.Ran || first.Token == 0 {
		t.Fatalf("Once that completes: %+v; want Ran with a token", first)
	}

	// Done, with the completing token, from another node.
	r, err = schedule.Once(ctx, b, "payment-1", func(context.Context, *dlock.Lease) error { t.Error("ran again"); return nil })
	if err != nil || r.Status != schedule.Done || r.Token != first.Token {
		t.Fatalf("Once after completion: %+v, %v; want Done with token %v", r, err, first.Token)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (one failure, one completion)", n)
	}

	// Lost lease: Redo, never Done.
	r, err = schedule.Once(ctx, a, "payment-2", func(fctx context.Context, lease *dlock.Lease) error {
		if _, err := dlock.Break(ctx, b, lease.Key()); err != nil {
			t.Error(err)
		}
		return nil // the work "finishes", but its lease is gone
	}, schedule.WithLeaseTTL(2*time.Second))
	if r.Status != schedule.Redo || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Once whose lease was broken before the record: %+v, %v; want Redo with ErrLeaseLost", r, err)
	}
	r, err = schedule.Once(ctx, b, "payment-2", func(context.Context, *dlock.Lease) error { return nil })
	if err != nil || r.Status != schedule.Ran {
		t.Fatalf("retry after a lost lease: %+v, %v; want Ran (the work is redone)", r, err)
	}
}

// testOnceRetention: a record lasts its retention and then expires on the
// backend by itself; Forget removes one at once.
func testOnceRetention(t *testing.T, dsn string) {
	ctx := testCtx(t, 30*time.Second)
	l := open(t, dsn)
	var runs atomic.Int32
	fn := func(context.Context, *dlock.Lease) error { runs.Add(1); return nil }
	const keep = time.Second
	if r, err := schedule.Once(ctx, l, "k", fn, schedule.WithRetention(keep)); err != nil || r.Status != schedule.Ran {
		t.Fatalf("first Once: %+v, %v", r, err)
	}
	recorded := time.Now()
	if r, _ := schedule.Once(ctx, l, "k", fn, schedule.WithRetention(keep)); r.Status != schedule.Done {
		t.Fatalf("Once within the retention: %+v, want Done", r)
	}
	for {
		r, err := schedule.Once(ctx, l, "k", fn, schedule.WithRetention(keep))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == schedule.Ran {
			if age := time.Since(recorded); age < keep-100*time.Millisecond {
				t.Fatalf("the record expired after %v, want about the retention %v", age, keep)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the record never expired")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := schedule.Forget(ctx, l, "k"); err != nil {
		t.Fatal(err)
	}
	if r, err := schedule.Once(ctx, l, "k", fn); err != nil || r.Status != schedule.Ran {
		t.Fatalf("Once after Forget: %+v, %v; want Ran", r, err)
	}
	if err := schedule.Forget(ctx, l, "never-done"); err != nil {
		t.Fatalf("Forget of a key with no record: %v", err)
	}
}
