package conformance_test

import (
	"strings"
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
type memHarness struct {
	name  string // the store's name in mem://NAME
	store *memlock.Store
}

// newMemHarness returns a harness on a shared store of its own, so that
// dlock.Open("mem://NAME") reaches it too.
func newMemHarness(t testing.TB) memHarness {
	name := strings.ReplaceAll(t.Name(), "/", ".")
	return memHarness{name: name, store: memlock.Shared(name)}
}

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
	conformance.Run(t, newMemHarness(t))
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, newMemHarness(b))
}

// Waiters counts key's queue in the store.
func (h memHarness) Waiters(_ testing.TB, key string) int { return h.store.Waiters(key) }

// Residue reports the key if the store holds it.
func (h memHarness) Residue(_ testing.TB, key string) []string {
	if h.store.Held(key) {
		return []string{key}
	}
	return nil
}

// DSN opens the harness's store.
func (h memHarness) DSN(testing.TB) string { return "mem://" + h.name }

var (
	_ conformance.Inspector     = memHarness{}
	_ conformance.DSNer         = memHarness{}
	_ conformance.WaiterCounter = memHarness{}
)
