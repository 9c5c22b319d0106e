package conformance_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memHarness runs the suite on the in-process reference driver: the suite tests
// itself with it.
type memHarness struct{ store *memlock.Store }

func (h memHarness) NewLocker(t testing.TB) dlock.Locker {
	l, err := dlock.New(h.store.NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (h memHarness) Expire(t testing.TB, key string) {
	if !h.store.Expire(key) {
		t.Fatalf("Expire(%q): key was not held", key)
	}
}

func (memHarness) ShortTTL() time.Duration { return 300 * time.Millisecond }

func TestConformance(t *testing.T) {
	conformance.Run(t, memHarness{store: memlock.NewStore()})
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, memHarness{store: memlock.NewStore()})
}

// Waiters counts key's queue in the store.
func (h memHarness) Waiters(_ testing.TB, key string) int { return h.store.Waiters(key) }
