package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
)

// Open a Locker on a three-member cluster by DSN and do fenced work under a
// lock. The path of the DSN is the key prefix; ttl is how long the cluster
// keeps a lock whose holder stops renewing it.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		// Send lease.Token() with every write; ctx ends if the lease is lost.
		fmt.Println("running with token", lease.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Build a Locker over a clientv3 client you configured yourself (TLS,
// authentication, balancer, logging). Closing the Locker leaves the client
// open.
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"127.0.0.1:2379"},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	locker, err := etcd.New(context.Background(), cli, &etcd.Options{Prefix: "/myapp/locks"}, dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(context.Background(), "reports/daily")
	if err != nil {
		log.Fatal(err) // errors.Is(err, dlock.ErrNotAcquired) if another client holds it
	}
	defer lease.Release(context.Background())
}

// LockName gives the name under which `etcdctl lock` and concurrency.Mutex
// queue together with dlock for a key.
func ExampleLockName() {
	// etcdctl lock /dlock/jobs%2Fnightly -- ./run-nightly.sh
	// excludes dlock's holders of "jobs/nightly" under the default prefix.
	fmt.Println(etcd.LockName(etcd.DefaultPrefix, "jobs/nightly"))
	// Output: /dlock/jobs%2Fnightly
}
