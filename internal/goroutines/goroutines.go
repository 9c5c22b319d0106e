// Package goroutines counts a process's goroutines for tests and benchmarks
// that compare the figure before and after holding leases. It imports only
// the standard library and builds on every platform.
package goroutines

import (
	"runtime"
	"time"
)

// Steady returns the number of goroutines once it has stayed the same for
// 100ms (or after 2s), so that goroutines a call started just before are
// counted.
func Steady() int {
	n := runtime.NumGoroutine()
	for same, end := 0, time.Now().Add(2*time.Second); same < 5 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}
