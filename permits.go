package dlock

// WithPermits makes an Acquire, TryAcquire or Do take one of n permits of the
// semaphore key, in the backend's own semaphore layout, rather than the lock
// key: up to n holders at once, counting other clients of that layout (on
// ZooKeeper, Apache Curator's InterProcessSemaphoreV2 on the key's path; on
// etcd, a waiting room and one lock name per slot, see package etcd).
// The lease is a permit: renewed, lost loudly and ended by the backend when
// its holder vanishes, like any lease. Its Key is the key of the slot the
// backend gave it, key + "/permits/" + i with 0 ≤ i < n, no other holder's
// at the time, and its Token is strictly greater than every earlier
// holder's of that slot: fence writes with one guard per Key, as package
// semaphore's permits are fenced in every layout. Every holder must use
// the same n: an acquire that finds a holder using another is refused with
// ErrSizeMismatch where the layout records it.
//
// Only a Locker whose Capabilities().Counted is true can: others refuse it
// with an error matching errors.ErrUnsupported (package semaphore builds a
// semaphore out of plain locks for them, and uses WithPermits where it is
// claimed). n must be > 0; it cannot be combined with WithShared, and a
// counted acquire is never a nested hold (WithReentrant).
//
// Default 0, a lock; not a DSN parameter: it is chosen per acquire.
func WithPermits(n int) Option {
	return func(s *settings) {
		s.permits = n
		if n == 0 {
			s.permits = -1 // refused by settings.with: 0 is the lock's default, never asked for
		}
	}
}
