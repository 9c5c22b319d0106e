package semaphore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/semaphore"
)

// At most two workers use the GPUs at once; a third is refused by
// TryAcquire, and gets in once a permit comes back.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-semaphore") // any DSN: redis://, etcd://, zk://, postgres://, mysql://
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	gpus, err := semaphore.New(locker, "gpus", 2)
	if err != nil {
		panic(err)
	}
	a, _ := gpus.Acquire(ctx)
	b, _ := gpus.Acquire(ctx)
	_, err = gpus.TryAcquire(ctx)
	fmt.Println("third worker refused:", errors.Is(err, dlock.ErrNotAcquired))

	_ = a.Release(ctx)
	c, err := gpus.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("third worker got the slot the first gave back:", c.Slot() == a.Slot())
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// third worker refused: true
	// third worker got the slot the first gave back: true
}

// A resource fences permit holders with one guard keyed by the permit's slot:
// the holder of a permit that was lost (and granted again) is rejected.
func Example_fencing() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-semaphore-fencing")
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	quota, _ := semaphore.New(locker, "api-quota", 1)

	var guard fencing.Guard // at the resource
	write := func(p *semaphore.Permit) error {
		return guard.Do(p.Key(), p.Token(), func() error { return nil })
	}
	old, _ := quota.Acquire(ctx)
	_ = old.Release(ctx) // (as if it had been lost: a pause past its TTL)
	current, _ := quota.Acquire(ctx)
	fmt.Println("current holder writes:", write(current) == nil)
	fmt.Println("old holder rejected:", errors.Is(write(old), fencing.ErrStaleToken))
	_ = current.Release(ctx)
	// Output:
	// current holder writes: true
	// old holder rejected: true
}
