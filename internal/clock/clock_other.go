//go:build !linux

package clock

import "time"

type system struct{}

func (system) Now() time.Duration { return monotonic() }

// SuspendAware reports whether System counts time the host spends suspended.
func SuspendAware() bool { return false }
