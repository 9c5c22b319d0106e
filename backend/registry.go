package backend

import (
	"context"
	"net/url"
	"slices"
	"sync"
)

// OpenFunc opens a driver from a parsed DSN. The URL has already been stripped
// of dlock's portable parameters (such as ttl); the driver rejects any parameter
// it does not know (see Params). Errors must not contain the URL's password:
// use Redact when a message needs the DSN.
type OpenFunc func(ctx context.Context, u *url.URL) (Driver, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]OpenFunc{}
)

// Register makes a driver available to dlock.Open under a DSN scheme, such as
// "redis". It is meant to be called from a driver package's init function.
// Like sql.Register it panics if open is nil, if scheme is empty, or if Register
// is called twice with the same scheme: all three are programming errors.
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
