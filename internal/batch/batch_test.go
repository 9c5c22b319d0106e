package batch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Callers that ask at once share one call; a caller that asks after a call
// started gets a later one, which started after it asked.
func TestDoSharesCalls(t *testing.T) {
	var wg sync.WaitGroup
	var calls atomic.Int32
	release := make(chan struct{})
	g := New(10*time.Millisecond, &wg, func() error {
		calls.Add(1)
		<-release
		return nil
	})
	ctx := context.Background()
	asked := time.Now()
	var callers sync.WaitGroup
	for range 50 {
		callers.Go(func() {
			started, err := g.Do(ctx)
			if err != nil || started.Before(asked) {
				t.Errorf("Do: started %v, asked %v, err %v", started, asked, err)
			}
		})
	}
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	late := time.Now()
	lateDone := make(chan time.Time, 1)
	go func() {
		started, _ := g.Do(ctx)
		lateDone <- started
	}()
	close(release)
	callers.Wait()
	if started := <-lateDone; started.Before(late) {
		t.Errorf("a caller that asked while a call ran was served by a call that started %v before it asked", late.Sub(started))
	}
	wg.Wait()
	// The 50 share the first call, or the first and one more (those that
	// asked as it started); the late one shares the next.
	if n := calls.Load(); n < 2 || n > 3 {
		t.Errorf("51 callers made %d calls, want 2 or 3", n)
	}
}

// A caller whose ctx ends stops waiting; the call goes on for the others,
// and its error reaches them.
func TestDoCtxAndError(t *testing.T) {
	var wg sync.WaitGroup
	boom := errors.New("boom")
	release := make(chan struct{})
	g := New(0, &wg, func() error { <-release; return boom })
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { _, err := g.Do(ctx); got <- err }()
	other := make(chan error, 1)
	go func() { _, err := g.Do(context.Background()); other <- err }()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v", err)
	}
	close(release)
	if err := <-other; !errors.Is(err, boom) {
		t.Errorf("other caller: %v, want the call's error", err)
	}
	wg.Wait()
}

// Each caller of a Batcher gets the result for its own item, and callers
// that ask at once share one call.
func TestBatcherResultsPerItem(t *testing.T) {
	var wg sync.WaitGroup
	var calls atomic.Int32
	release := make(chan struct{})
	b := NewBatcher(10*time.Millisecond, &wg, func(items []int) ([]int, error) {
		calls.Add(1)
		<-release
		out := make([]int, len(items))
		for i, x := range items {
			out[i] = x * x
		}
		return out, nil
	})
	var callers sync.WaitGroup
	for i := range 40 {
		callers.Go(func() {
			got, err := b.Do(context.Background(), i)
			if err != nil || got != i*i {
				t.Errorf("Do(%d) = %d, %v; want %d", i, got, err, i*i)
			}
		})
	}
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	callers.Wait()
	wg.Wait()
	if n := calls.Load(); n > 3 {
		t.Errorf("40 callers made %d calls", n)
	}
}
