//go:build !linux

package clock

import "time"

type system struct{}

// origin is the monotonic clock's origin for System.
var origin = time.Now()

func (system) Now() time.Duration { return time.Since(origin) }

// read is Read for System: its reading derived from the same time.Now.
func (system) read() (time.Time, time.Duration) {
	t := time.Now()
	return t, t.Sub(origin)
}

// SuspendAware reports whether System counts time the host spends suspended.
func SuspendAware() bool { return false }
