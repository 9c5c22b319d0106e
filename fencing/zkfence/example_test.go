package zkfence_test

import (
	"context"
	"errors"
	"log"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/zkfence"
	"github.com/dlock-go/dlock/third_party/zk"
)

// A holder of the lock "config/app" sets a config node and removes a draft
// in one fenced multi: the fence's update and the writes apply together or
// not at all.
func ExampleGuard_Multi() {
	ctx := context.Background()
	var conn *zk.Conn       // e.g. zk.Connect([]string{"localhost:2181"}, 10*time.Second)
	var locker dlock.Locker // e.g. dlock.Open(ctx, "zk://localhost:2181/dlock")
	if conn == nil || locker == nil {
		return // this example shows the calls; it has no server to run on
	}
	guard := zkfence.Guard{Conn: conn}
	err := dlock.Do(ctx, locker, "config/app", func(ctx context.Context, lease *dlock.Lease) error {
		_, err := guard.Multi(ctx, lease.Token(), "config/app",
			&zk.SetDataRequest{Path: "/config/app", Data: []byte("v42"), Version: -1},
			&zk.DeleteRequest{Path: "/config/app-draft", Version: -1})
		return err
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer holder has written the config; this multi was refused")
	}
}
