package backend

import (
	"context"
	"net/url"
	"slices"
	"sync"
)

// OpenFunc opens a driver from a parsed DSN, stripped of dlock's portable
// parameters; it rejects unknown parameters (Params) and never puts the
// password in an error (Redact).
type OpenFunc func(ctx context.Context, u *url.URL) (Driver, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]OpenFunc{}
)

// Register makes a driver available to dlock.Open under a DSN scheme, such as
// "redis", from a driver package's init function. Like sql.Register it panics
// on an empty scheme, a nil open or a scheme registered twice.
func Register(scheme string, open OpenFunc) {
	if scheme == "" {
		panic("dlock/backend: Register with an empty scheme")
	}
	if open == nil {
		panic("dlock/backend: Register of scheme " + scheme + " with a nil OpenFunc")
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic("dlock/backend: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Lookup returns the OpenFunc registered for scheme.
func Lookup(scheme string) (OpenFunc, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	f, ok := registry[scheme]
	return f, ok
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}
