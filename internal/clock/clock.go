// Package clock reads elapsed time on a clock that keeps counting while the
// host is suspended, so that a lease's deadline passes during a VM pause, a
// live migration or a laptop's sleep exactly as it does on the lock server.
//
// Go's monotonic clock (the reading inside time.Now, and what timers run on)
// is CLOCK_MONOTONIC on Linux, which stops while the machine is suspended: a
// deadline measured on it is pushed back by the length of the suspend, and
// the holder would believe in a lock the server has already expired. System
// reads CLOCK_BOOTTIME on Linux instead, which counts the suspend. On other
// platforms it falls back to the runtime's monotonic clock; see System.
package clock

import "time"

// Clock reads elapsed time since an arbitrary origin fixed for the life of
// the process. Readings from one Clock are comparable with each other only.
type Clock interface {
	// Now returns the time elapsed since the Clock's origin. It never goes
	// backwards.
	Now() time.Duration
}

// System is the process's suspend-aware clock: CLOCK_BOOTTIME on Linux
// (which includes time spent suspended). On every other platform it is Go's
// monotonic clock, which on macOS and the BSDs may not count a sleep either:
// there a lease is believed for up to one scheduler tick (at most MaxSleep)
// after the machine wakes from a sleep that outlasted it.
var System Clock = system{}

// MaxSleep bounds how long code waiting for a deadline on Clock may sleep on a
// Go timer (which runs on the monotonic clock and so does not count a
// suspend) before it reads the Clock again: after the host resumes, a
// deadline that passed during the suspend is noticed within MaxSleep.
const MaxSleep = time.Second

// Offset maps readings of c onto Go's time.Time: the returned function
// converts a time.Time taken near the call (with a monotonic reading) into a
// reading of c, conservatively. It reads both clocks once, now; a time t is
// mapped to c.Now() + (t - now) as measured on the monotonic clock. If the
// host was suspended between t and now, t maps to a reading earlier than the
// true one — the safe side for a lease's start, which is always read before
// the request it dates.
func Offset(c Clock) func(time.Time) time.Duration {
	mono, at := Read(c)
	return func(t time.Time) time.Duration { return at + t.Sub(mono) }
}

// Read returns time.Now() and c.Now() as of one moment. For System it reads
// the clocks once, where time.Now() then c.Now() would read them twice (each
// read is 0.05–0.3 µs on a VM, and an acquire and release make several).
func Read(c Clock) (time.Time, time.Duration) {
	if r, ok := c.(reader); ok {
		return r.read()
	}
	return time.Now(), c.Now()
}

// reader is a Clock that can derive its reading from one time.Now.
type reader interface {
	read() (time.Time, time.Duration)
}
