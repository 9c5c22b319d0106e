package nats

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// SetWatchKey replaces how a waiter sets up its watch until the returned
// function restores it.
func SetWatchKey(f func(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyWatcher, error)) (restore func()) {
	old := watchKey
	watchKey = f
	return func() { watchKey = old }
}
