package backend

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"time"
)

// NewOwnerID returns a random 128-bit id in hex, from crypto/rand. dlock gives
// every lease its own owner id, so that refresh and release prove "it is me".
func NewOwnerID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never returns an error (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}

// DriftAllowance returns the part of ttl a client must not count on, for
// clock-rate differences and timer slack: 1% of ttl plus 2ms, as Redlock
// prescribes. Drivers subtract it from the TTL to get Grant.Validity.
func DriftAllowance(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// Backoff yields jittered waits for drivers that poll, each drawn uniformly
// from [d/2, d], where d starts at Min and doubles up to Max. It is not safe
// for concurrent use: use one per waiting call.
type Backoff struct {
	// Min is the first nominal wait. Default 10ms.
	Min time.Duration
	// Max caps the nominal wait. Default 1s.
	Max time.Duration

	cur time.Duration
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 10 * time.Millisecond
	}
	if hi < lo {
		hi = max(lo, time.Second)
	}
	if b.cur == 0 {
		b.cur = lo
	} else {
		b.cur = min(2*b.cur, hi)
	}
	return Jitter(b.cur)
}

// Reset starts the sequence again from Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Jitter returns a duration drawn uniformly from [d/2, d].
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
