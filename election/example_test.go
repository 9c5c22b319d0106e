package election_test

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	_ "github.com/dlock-go/dlock/memlock"
)

// Two candidates campaign; the first leads, publishes its address, and
// resigns; the second then leads with a higher token.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-election") // any DSN: redis://, etcd://, zk://, postgres://
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	first, err := election.Campaign(ctx, locker, "scheduler", "10.0.0.7:8080")
	if err != nil {
		panic(err)
	}
	who, _ := election.Leader(ctx, locker, "scheduler")
	fmt.Println("leader:", who.Value)

	next := make(chan *election.Leadership)
	go func() {
		ld, err := election.Campaign(ctx, locker, "scheduler", "10.0.0.8:8080")
		if err != nil {
			panic(err)
		}
		next <- ld
	}()
	_ = first.Resign(ctx)
	second := <-next
	fmt.Println("next leader:", second.Value(), "higher token:", second.Token() > first.Token())
	_ = second.Resign(ctx)
	// Output:
	// leader: 10.0.0.7:8080
	// next leader: 10.0.0.8:8080 higher token: true
}

// Run keeps a candidate in the election: fn runs while it leads, with a ctx
// cancelled the moment leadership is lost.
func ExampleRun() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-run")
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	terms := 0
	err = election.Run(ctx, election.Config{
		Locker: locker,
		Name:   "compactor",
		Value:  "host-a",
		OnStartedLeading: func(ctx context.Context, ld *election.Leadership) error {
			fmt.Println("leading, token", ld.Token())
			// Work with ld.Token() on every write; stop when ctx is done.
			if terms++; terms == 2 {
				return election.ErrStop // leave the election after the second term
			}
			return nil
		},
	})
	fmt.Println("stopped:", err)
	// Output:
	// leading, token 1
	// leading, token 2
	// stopped: <nil>
}
