package clock

import "time"

var origin = time.Now()

// monotonic reads Go's monotonic clock, relative to process start.
func monotonic() time.Duration { return time.Since(origin) }
