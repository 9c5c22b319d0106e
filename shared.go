package dlock

// WithShared makes an Acquire, TryAcquire or Do take the lock in shared mode,
// in the backend's own layout (PostgreSQL's pg_advisory_lock_shared, say):
// any number of shared holders at once, none while an exclusive holder (an
// acquire without WithShared) holds the key, and none while an exclusive
// acquire waits for it, so that a stream of shared holders never starves a
// writer. A shared lease is a lease like any other — renewed, lost loudly,
// expired by the backend if its holder vanishes — and its token is above
// every earlier grant's of the key, shared or not, and below every later
// one's: fence writes with exclusive leases' tokens; a shared lease's token
// says between which two exclusive holds it fell.
//
// Only a Locker whose Capabilities().Shared is true can: others refuse it with
// an error matching errors.ErrUnsupported (package rwlock builds a read/write
// lock out of plain locks for them). AcquireAll with WithShared takes the keys
// one at a time, in sorted order.
//
// With WithReentrant, a shared acquire under a ctx that carries a hold of the
// same key (shared or exclusive) is a nested hold of it; an exclusive acquire
// under a shared hold of the same key is refused with ErrUpgrade, since it
// would wait for itself.
//
// Off by default; not a DSN parameter: it is chosen per acquire.
func WithShared() Option {
	return func(s *settings) { s.shared = true }
}

// Shared reports whether the lease holds its lock shared (WithShared). A
// nested hold (WithReentrant) reports its outermost lease's mode.
func (l *Lease) Shared() bool { return l.outermost().set.shared }
