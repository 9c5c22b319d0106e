package schedule_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
)

// Two nodes reach the same scheduled run (the second one later, as a node
// whose clock is behind would): one runs it, the other finds its record.
func ExampleRun() {
	ctx := context.Background()
	node1, _ := dlock.Open(ctx, "mem://example-schedule") // any DSN whose locks can be orphaned: redis://, pgtable://, etcd://
	node2, _ := dlock.Open(ctx, "mem://example-schedule")
	defer node1.Close()
	defer node2.Close()

	job := schedule.Job{Name: "nightly-report", AtMost: time.Minute, AtLeast: time.Second}
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC) // the run's scheduled time, not the time of the call
	for _, node := range []dlock.Locker{node1, node2} {
		r, err := schedule.Run(ctx, node, job, at, func(ctx context.Context, lease *dlock.Lease) error {
			fmt.Println("building the report; writes carry token", lease.Token() > 0)
			return nil
		})
		fmt.Println(r.Status, err)
	}
	// Output:
	// building the report; writes carry token true
	// ran <nil>
	// done <nil>
}

// A retried request runs its side effect once per idempotency key.
func ExampleOnce() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://example-once")
	defer locker.Close()

	charge := func(ctx context.Context, lease *dlock.Lease) error {
		fmt.Println("charging the card")
		return nil
	}
	for range 2 {
		r, err := schedule.Once(ctx, locker, "payment/4711", charge, schedule.WithRetention(time.Hour))
		fmt.Println(r.Status, err)
	}
	// Output:
	// charging the card
	// ran <nil>
	// done <nil>
}
