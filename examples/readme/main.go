package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/memlock" // registers mem://, an in-process backend
)

func main() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://demo?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	// The resource: it remembers the highest token it accepted and rejects lower ones.
	var storage fencing.Guard
	write := func(token dlock.Token, what string) error {
		return storage.Do("invoices/2026-11", token, func() error {
			fmt.Printf("stored %s with token %d\n", what, token)
			return nil
		})
	}

	// Holder A takes the lock, then stalls (a GC pause, a frozen VM) past its TTL.
	a, err := locker.Acquire(ctx, "invoices/2026-11",
		dlock.WithTTL(100*time.Millisecond), dlock.WithAutoRenew(false))
	if err != nil {
		log.Fatal(err)
	}
	<-a.Done() // A's lease expires while A is stalled

	// Holder B gets the lock, with a higher token, and writes.
	err = dlock.Do(ctx, locker, "invoices/2026-11", func(ctx context.Context, b *dlock.Lease) error {
		// ctx is cancelled, with cause dlock.ErrLeaseLost, if B's lease is lost.
		return write(b.Token(), "B's invoice")
	})
	if err != nil {
		log.Fatal(err)
	}

	// A wakes up and writes with its old token: the resource rejects it.
	err = write(a.Token(), "A's invoice")
	fmt.Println("A rejected:", errors.Is(err, fencing.ErrStaleToken))
	fmt.Println(err)
}
