package dlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
)

// callbackDriver is memlock reporting loss through AcquireRequest.OnLost
// instead of Grant.Lost, as a driver with one watcher for many grants does.
type callbackDriver struct {
	backend.Driver
	fireBeforeReturn bool

	mu     sync.Mutex
	onLost map[string]func(error) // by owner
}

func (d *callbackDriver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	g, err := d.Driver.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	g.Lost = nil
	d.mu.Lock()
	d.onLost[g.Owner] = req.OnLost
	d.mu.Unlock()
	if d.fireBeforeReturn {
		req.OnLost(errors.New("watch saw the key deleted"))
	}
	return g, nil
}

func (d *callbackDriver) lose(owner string, cause error) {
	d.mu.Lock()
	f := d.onLost[owner]
	d.mu.Unlock()
	f(cause)
}

func newCallbackLocker(t *testing.T, before bool) (*locker, *callbackDriver) {
	t.Helper()
	d := &callbackDriver{Driver: memlock.NewStore().NewDriver(), fireBeforeReturn: before, onLost: map[string]func(error){}}
	s, err := defaultSettings().withLocker([]Option{WithTTL(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(d, "callback", s)
	t.Cleanup(func() { _ = l.Close() })
	return l, d
}

func TestOnLostEndsLease(t *testing.T) {
	l, d := newCallbackLocker(t, false)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("session expired")
	d.lose(lease.grant.Owner, cause)
	d.lose(lease.grant.Owner, errors.New("a second report")) // ignored
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done still open after the driver reported the loss")
	}
	if err := lease.Err(); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, cause) {
		t.Fatalf("Err = %v, want ErrLeaseLost wrapping the driver's cause", err)
	}
}

// A loss reported while the grant is still on its way to the caller ends the
// lease the moment it exists: the caller never holds a lease the driver
// already knows is gone.
func TestOnLostBeforeReturnEndsLease(t *testing.T) {
	l, _ := newCallbackLocker(t, true)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	default:
		t.Fatal("a lease lost during Acquire was handed out open")
	}
	if err := lease.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
}

// The core spends no goroutine per lease on loss signalling for a driver that
// reports through OnLost.
func TestOnLostNoGoroutinePerLease(t *testing.T) {
	l, _ := newCallbackLocker(t, false)
	const n = 1000
	before := runtime.NumGoroutine()
	leases := make([]*Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(context.Background(), fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	if grew := runtime.NumGoroutine() - before; grew > 10 {
		t.Fatalf("%d held leases added %d goroutines", n, grew)
	}
	for _, lease := range leases {
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
