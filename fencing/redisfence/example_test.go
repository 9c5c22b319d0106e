package redisfence_test

import (
	"context"
	"errors"
	"log"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/redisfence"
)

// A job that holds the lock "reports/daily" writes its result to Redis
// through the guard: the fence key and the data key share the hash tag
// {reports/daily}, and one script checks the token and writes. A holder
// whose lease was lost while a newer holder wrote is refused.
func ExampleGuard_Set() {
	ctx := context.Background()
	var client *goredis.Client // e.g. goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
	var locker dlock.Locker    // e.g. dlock.Open(ctx, "redis://localhost:6379/0")
	if client == nil || locker == nil {
		return // this example shows the calls; it has no server to run on
	}
	guard := redisfence.Guard{Client: client}
	const resource = "reports/daily"
	err := dlock.Do(ctx, locker, resource, func(ctx context.Context, lease *dlock.Lease) error {
		return guard.Set(ctx, lease.Token(), resource, redisfence.Key(resource, ":result"), "done", 0)
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer holder has written the report; this write was refused")
	}
}

// A script of your own, run only while the token is current: it sees its
// own keys and arguments as KEYS and ARGV.
func ExampleNewScript() {
	ctx := context.Background()
	var client *goredis.Client
	var lease *dlock.Lease // held for "queue/7"
	if client == nil || lease == nil {
		return // this example shows the calls; it has no server to run on
	}
	push := redisfence.NewScript(`redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('LLEN', KEYS[1])`)
	guard := redisfence.Guard{Client: client}
	n, err := guard.Run(ctx, lease.Token(), "queue/7", push, []string{redisfence.Key("queue/7", ":items")}, "item")
	log.Print(n, err)
}
