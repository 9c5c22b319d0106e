package rwlock_test

import (
	"testing"

	"go.uber.org/goleak"

	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/rwlock"
)

// Readers share the lock, a writer has it alone, and a read's token tells
// which writes came before it.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-rwlock") // any DSN: redis://, etcd://, zk://, postgres://, mysql://
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	config, err := rwlock.New(locker, "config")
	if err != nil {
		panic(err)
	}

	var written dlock.Token
	err = config.Write(ctx, func(ctx context.Context, h *rwlock.Hold) error {
		written = h.Token() // write with it: the resource fences by it
		return nil
	})
	if err != nil {
		panic(err)
	}
	r1, _ := config.RLock(ctx)
	r2, _ := config.TryRLock(ctx)
	_, err = config.TryLock(ctx)
	fmt.Println("two readers at once:", r2 != nil, "writer refused:", err != nil)
	fmt.Println("the readers saw the write:", r1.Token() > written && r2.Token() > written)
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)

	// Upgrading would wait for itself: refused.
	err = config.Read(ctx, func(ctx context.Context, h *rwlock.Hold) error {
		_, err := config.Lock(ctx)
		return err
	})
	fmt.Println(err)
	// Output:
	// two readers at once: true writer refused: true
	// the readers saw the write: true
	// rwlock "config": lock: rwlock: ctx already holds this lock (a read hold): upgrading or downgrading is not supported; release it first
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// valueLocker is a Locker whose type is not comparable (a struct with a
// slice), as a user's wrapper may be.
type valueLocker struct {
	dlock.Locker
	tags []string
}

// Nested-hold detection must not panic on a Locker that == cannot compare.
func TestNestedOnAnIncomparableLocker(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://rwlock-incomparable")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m, err := rwlock.New(valueLocker{Locker: l, tags: []string{"x"}}, "k")
	if err != nil {
		t.Fatal(err)
	}
	err = m.Read(ctx, func(ctx context.Context, h *rwlock.Hold) error {
		r, err := m.TryRLock(ctx) // not detected as nested: a second reader
		if err != nil {
			return err
		}
		return r.Release(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
}
