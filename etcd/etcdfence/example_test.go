package etcdfence_test

import (
	"context"
	"errors"
	"log"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd/etcdfence"
	"github.com/dlock-go/dlock/fencing"
)

// A holder of the lock "config/app" updates two keys in one fenced
// transaction: the fence check, the writes and the new fence commit
// together or not at all.
func ExampleGuard_Txn() {
	ctx := context.Background()
	var cli *clientv3.Client // e.g. clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	var locker dlock.Locker  // e.g. dlock.Open(ctx, "etcd://localhost:2379/locks")
	if cli == nil || locker == nil {
		return // this example shows the calls; it has no server to run on
	}
	guard := etcdfence.Guard{Client: cli}
	err := dlock.Do(ctx, locker, "config/app", func(ctx context.Context, lease *dlock.Lease) error {
		_, err := guard.Txn(ctx, lease.Token(), "config/app",
			clientv3.OpPut("/config/app/version", "42"),
			clientv3.OpDelete("/config/app/draft"))
		return err
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer holder has written the config; this transaction was refused")
	}
}
