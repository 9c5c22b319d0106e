package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	dlocknats "github.com/dlock-go/dlock/nats"
)

// TestWaiterNotHeldUpByWatchSetup: a waiter whose driver's bucket watch
// cannot be set up (a consumer creation the servers never answer, as when
// the meta leader dies with the request) still tries at every poll
// interval, and is granted once the holder lets go.
func TestWaiterNotHeldUpByWatchSetup(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	setups := make(chan struct{}, 1)
	// Replaced before the locker opens, restored after it closes.
	defer dlocknats.SetWatchKey(func(ctx context.Context, _ jetstream.KeyValue, _ string) (jetstream.KeyWatcher, error) {
		select {
		case setups <- struct{}{}:
		default:
		}
		<-ctx.Done() // unanswered until the driver gives up on it
		return nil, ctx.Err()
	})()
	l, err := dlock.Open(ctx, srv.URL()+"/"+testBucket+"?poll=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() { // owned by the test: it reads got before returning
		lease, err := l.Acquire(wctx, "k")
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	<-setups // the watch is being set up in vain
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter, whose watch setup went unanswered, was not granted after the release: %v", err)
	}
}
