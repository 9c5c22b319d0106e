package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redis"
)

// Open a Locker from a DSN and run a job under a lock. The import of this
// package registers the schemes redis:// and rediss://.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s&prefix=myapp:")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		// Send lease.Token() with every write, so the resource can reject a
		// stale holder (see package fencing).
		fmt.Println("running with token", lease.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Use a go-redis client you already have. Closing the Locker leaves the
// client open.
func ExampleNew() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	locker, err := redis.New(context.Background(), client, &redis.Options{PollInterval: 500 * time.Millisecond}, dlock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := locker.Acquire(ctx, "reports/daily") // waits up to 5s
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	fmt.Println("holding", lease.Key(), "until at least", lease.Deadline())
}

// Lock across a Redis Cluster: a key's lock and fencing counter share a hash
// tag, so each key lives in one slot.
func ExampleNewDriver() {
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
	})
	defer client.Close()

	d, err := redis.NewDriver(context.Background(), client, nil) // nil: DefaultPrefix, DefaultPollInterval
	if err != nil {
		log.Fatal(err)
	}
	locker, err := dlock.New(d) // the Locker closes d, not client
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	fmt.Println(locker.Capabilities().Fencing)
}

// The Redis names of a dlock key, for operators and tests.
func ExampleLockKey() {
	fmt.Println(redis.LockKey(redis.DefaultPrefix, "jobs/nightly"))
	fmt.Println(redis.FenceKey(redis.DefaultPrefix, "jobs/nightly"))
	fmt.Println(redis.ReleaseChannel(redis.DefaultPrefix, "jobs/nightly"))
	fmt.Println(redis.LockKey(redis.DefaultPrefix, "odd{key}%"))
	// Output:
	// dlock:{jobs/nightly}
	// dlock:{jobs/nightly}:fence
	// dlock:{jobs/nightly}:released
	// dlock:{odd%7Bkey%7D%25}
}
