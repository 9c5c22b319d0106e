package redlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redlock"
)

// Open a Locker on five independent Redis masters and run a job under a lock.
// The import of this package registers the schemes redlock:// and redlocks://.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "redlock://:secret@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	// Redlock's tokens are timing-dependent: check before relying on them.
	if locker.Capabilities().Fencing != backend.FencingStrict {
		log.Print("fencing tokens may go backwards on clock skew or a node restart without persistence")
	}
	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		fmt.Println("running with token", lease.Token())
		return nil
	})
	switch {
	case errors.Is(err, redlock.ErrNoQuorum):
		log.Fatal("fewer than 3 of the 5 nodes answered: ", err) // the error names each node and why
	case err != nil:
		log.Fatal(err)
	}
}

// Build the clients in code: a different password and TLS setting per node,
// and tuned timeouts. Every client needs ContextTimeoutEnabled. Closing the
// Locker leaves the clients open.
func ExampleNew() {
	ctx := context.Background()
	var clients []*goredis.Client
	for i, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		clients = append(clients, goredis.NewClient(&goredis.Options{
			Addr:                  addr,
			Password:              fmt.Sprintf("password-of-node-%d", i+1),
			TLSConfig:             &tls.Config{ServerName: fmt.Sprintf("redis-%d.internal", i+1), MinVersion: tls.VersionTLS12},
			ContextTimeoutEnabled: true,
			MaxRetries:            -1, // one attempt per node and round, as the algorithm has it
		}))
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()

	locker, err := redlock.New(ctx, clients, &redlock.Options{NodeTimeout: 50 * time.Millisecond}, dlock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err) // e.g. a node is a Redis Cluster node, or fewer than 2 of 3 answer
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "reports/daily")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	fmt.Println("holding", lease.Key(), "until at least", lease.Deadline())
}

// The Redis names of a dlock key, the same on every node.
func ExampleLockKey() {
	fmt.Println(redlock.LockKey(redlock.DefaultPrefix, "jobs/nightly"))
	fmt.Println(redlock.FenceKey(redlock.DefaultPrefix, "jobs/nightly"))
	fmt.Println(redlock.ReleaseChannel(redlock.DefaultPrefix, "jobs/nightly"))
	// Output:
	// dlock:{jobs/nightly}
	// dlock:{jobs/nightly}:fence
	// dlock:{jobs/nightly}:released
}
