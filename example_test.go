package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/memlock" // registers mem://
)

// Open picks a backend by DSN. "mem://" is an in-process backend, registered
// by importing package memlock (as this file does); import a driver package
// (e.g. github.com/dlock-go/dlock/redis) to register its scheme.
func ExampleOpen() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-open?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	fmt.Println("fencing:", locker.Capabilities().Fencing)
	// Output: fencing: strict
}

// Capabilities tells an application what the backend's tokens mean, without
// importing the driver contract (package backend).
func ExampleCapabilities() {
	locker, err := dlock.Open(context.Background(), "mem://example-capabilities")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	if locker.Capabilities().Fencing != dlock.FencingStrict {
		log.Fatal("this job needs tokens that strictly increase whatever the timing")
	}
	fmt.Println("strict tokens; expiry decided by the", locker.Capabilities().TimeAuthority, "clock")
	// Output: strict tokens; expiry decided by the server clock
}

func ExampleLocker_Acquire() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-acquire")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	// Wait at most 5s for the lock. The timeout bounds the wait only: the lease
	// lives, renewed every TTL/3, until it is released.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := locker.Acquire(wctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// Another client's attempt fails at once while the lock is held.
	_, err = locker.TryAcquire(ctx, "jobs/nightly")
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	fmt.Println("token:", lease.Token())
	// Output:
	// true
	// token: 1
}

// Do runs a function under the lock and cancels its context the moment the
// lease is lost.
func ExampleDo() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-do")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "reports/daily", func(ctx context.Context, lease *dlock.Lease) error {
		// Long work selects on ctx.Done(); context.Cause(ctx) matches
		// dlock.ErrLeaseLost if the lock was lost.
		fmt.Println("generating report under token", lease.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// generating report under token 1
	// err: <nil>
}

// A fenced write: the resource remembers the highest token it has accepted and
// rejects older ones, so a holder that paused past its TTL cannot overwrite the
// work of the holder that came after it.
func Example_fencedWrite() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-fenced")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	var storage fencing.Guard // the resource side

	old, _ := locker.Acquire(ctx, "file", dlock.WithTTL(50*time.Millisecond), dlock.WithAutoRenew(false))
	<-old.Done() // old's holder "paused" past its TTL; its lease ended
	current, _ := locker.Acquire(ctx, "file")
	defer current.Release(ctx)

	fmt.Println(storage.Do("file", current.Token(), func() error { return nil }))
	err = storage.Do("file", old.Token(), func() error { return nil })
	fmt.Println(errors.Is(err, fencing.ErrStaleToken))
	// Output:
	// <nil>
	// true
}

// A function that takes the lock itself can be called by code that already
// holds it: under the ctx Do passes on, WithReentrant makes the inner acquire
// a nested hold of the same lease instead of a wait for itself.
func ExampleWithReentrant() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-reentrant", dlock.WithReentrant())
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	settle := func(ctx context.Context) error {
		return dlock.Do(ctx, locker, "accounts/42", func(ctx context.Context, lease *dlock.Lease) error {
			fmt.Println("settling with token", lease.Token())
			return nil
		})
	}
	err = dlock.Do(ctx, locker, "accounts/42", func(ctx context.Context, lease *dlock.Lease) error {
		fmt.Println("closing the month with token", lease.Token())
		return settle(ctx) // nested: same token, no deadlock
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// closing the month with token 1
	// settling with token 1
}

// AcquireAll takes several keys all or nothing, in sorted order, so that two
// callers asking for overlapping sets never deadlock. Each key keeps its own
// token.
func ExampleAcquireAll() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-acquire-all")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	set, err := dlock.AcquireAll(ctx, locker, []string{"accounts/7", "accounts/3"})
	if err != nil {
		log.Fatal(err) // none of the keys is held
	}
	defer set.Release(ctx)
	for _, lease := range set.Leases() {
		fmt.Println(lease.Key(), "token", lease.Token())
	}
	select {
	case <-set.Done(): // closed when any of the leases ends
	default:
		fmt.Println("all held")
	}
	// Output:
	// accounts/3 token 1
	// accounts/7 token 1
	// all held
}

// Inspect answers an operator's first question about a stuck job: who holds
// this lock, with which token, and how many wait. Break is the second: it
// force-releases the lock, and the next holder's token is higher, so the
// resource rejects the broken holder's writes.
func ExampleInspect() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-inspect", dlock.WithLabel("report-job@host7"))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}

	info, err := dlock.Inspect(ctx, locker, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held by", info.Label, "with token", info.Token, "and", info.Waiters, "waiting")

	broken, err := dlock.Break(ctx, locker, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	fmt.Println("broke token", broken.Token, "- the holder's lease lost:", errors.Is(lease.Err(), dlock.ErrLeaseLost))
	// Output:
	// held by report-job@host7 with token 1 and 0 waiting
	// broke token 1 - the holder's lease lost: true
}
