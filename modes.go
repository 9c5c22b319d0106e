package dlock

import "github.com/dlock-go/dlock/internal/mode/hook"

// The acquire modes, shared and counted, are not part of the API: package
// internal/mode gives them to packages rwlock and semaphore.
func init() {
	hook.Shared = func() any { return acquireOption(func(s *settings) { s.shared = true }) }
	hook.Permits = func(n int) any {
		return acquireOption(func(s *settings) {
			s.permits = n
			if n == 0 {
				s.permits = -1 // refused by check: 0 is the lock's default, never asked for
			}
		})
	}
}

// Shared reports whether the lease holds its lock shared (a rwlock read hold
// on a backend with shared locks); a nested hold reports its outermost lease's.
func (l *Lease) Shared() bool { return l.outermost().set.shared }
