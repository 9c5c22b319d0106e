//go:build !linux

package clock

import "time"

type system struct{}

// origin is the monotonic clock's origin for System.
var origin = time.Now()

func (system) Now() time.Duration { return time.Since(origin) }

// SuspendAware reports whether System counts time the host spends suspended.
func SuspendAware() bool { return false }
