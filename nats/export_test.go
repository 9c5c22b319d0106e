package nats

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func init() { testDrivers = new(sync.Map) }

// Waiters counts the waiting Acquires of key, over every open driver of
// the test binary, that their driver's bucket watch covers: a delete of the
// key from now on wakes them.
func Waiters(key string) int {
	n := 0
	testDrivers.Range(func(k, _ any) bool {
		n += k.(*Driver).watch.waiters(KeyName(key))
		return true
	})
	return n
}

// WatchLive reports whether the driver's bucket watch is set up.
func WatchLive(d *Driver) bool { return d.watch.isLive() }

// BreakWatches ends the bucket watch of every open driver, calling gap once
// each watch has ended and before it is set up again, until the test ends.
func BreakWatches(t testing.TB, gap func()) {
	testHookWatchDown.Store(&gap)
	t.Cleanup(func() { testHookWatchDown.Store(nil) })
	testDrivers.Range(func(k, _ any) bool {
		w := k.(*Driver).watch
		w.mu.Lock()
		kw := w.kw
		w.mu.Unlock()
		if kw != nil {
			_ = kw.Stop()
		}
		return true
	})
}

// SetWatchKey replaces how a driver sets up its bucket watch (key ">")
// until the returned function restores it.
func SetWatchKey(f func(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyWatcher, error)) (restore func()) {
	old := watchKey
	watchKey = f
	return func() { watchKey = old }
}
