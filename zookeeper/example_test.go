package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zookeeper"
)

// Open a Locker on a ZooKeeper ensemble from a DSN, and run a job under a
// lease. Every write the job makes carries the lease's token, the czxid of
// its lock node.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/myapp/locks?session=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		// ctx is cancelled the moment the session that holds the lock is lost.
		fmt.Println("running with fencing token", lease.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Lock over a connection the program already has. The driver cannot learn the
// session timeout of a connection it did not dial: pass the one the server
// negotiated (ZooKeeper grants what was asked within 2–20 × its tickTime).
func ExampleNew() {
	conn, _, err := zk.Connect([]string{"zk1:2181", "zk2:2181", "zk3:2181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	locker, err := zookeeper.New(context.Background(), conn, &zookeeper.Options{SessionTimeout: 10 * time.Second, Root: "/myapp/locks"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}

// Keys map onto one node name each; the lock nodes are its children.
func ExampleEscapeKey() {
	fmt.Println(zookeeper.EscapeKey("jobs/nightly"))
	fmt.Println(zookeeper.EscapeKey("50% off"))
	fmt.Println(zookeeper.EscapeKey(".."))
	fmt.Println(zookeeper.LockPath(zookeeper.DefaultRoot, "tenant/🔒"))
	// Output:
	// jobs%2Fnightly
	// 50%25 off
	// %2E%2E
	// /dlock/tenant%2F%F0%9F%94%92
}
