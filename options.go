package dlock

import (
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/observe"
)

// Defaults and limits.
const (
	// DefaultTTL is the default of WithTTL.
	DefaultTTL = 15 * time.Second

	// DefaultReleaseTimeout is the default of WithReleaseTimeout.
	DefaultReleaseTimeout = 5 * time.Second

	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
)

// Option configures a Locker (Open, New, a driver package's New); a
// [LeaseOption] sets its leases' default. A nil Option changes nothing.
type Option interface{ applyLocker(*settings) }

// AcquireOption configures one acquire (Acquire, TryAcquire, Do, AcquireAll,
// the primitives), over the Locker's defaults. A nil one changes nothing.
type AcquireOption interface{ applyAcquire(*settings) }

// LeaseOption is an option of a lease, both an [Option] (the Locker's default)
// and an [AcquireOption] (one lease's); the zero value changes nothing.
type LeaseOption struct{ set func(*settings) }

func (o LeaseOption) applyLocker(s *settings)  { o.apply(s) }
func (o LeaseOption) applyAcquire(s *settings) { o.apply(s) }

func (o LeaseOption) apply(s *settings) {
	if o.set != nil {
		o.set(s)
	}
}

// lockerOption is an Option of the Locker's scope only.
type lockerOption func(*settings)

func (o lockerOption) applyLocker(s *settings) { o(s) }

// acquireOption is an AcquireOption of one acquire's scope only (the shared
// and counted modes, see package internal/mode).
type acquireOption func(*settings)

func (o acquireOption) applyAcquire(s *settings) { o(s) }

type settings struct {
	ttl            time.Duration
	autoRenew      bool
	releaseTimeout time.Duration
	reentrant      bool
	shared         bool
	permits        int // mode.WithPermits; 0: a lock
	announce       bool
	label          string
	labelSet       bool // label was given (WithLabel), "" included
	observer       observe.Observer
	logger         *slog.Logger
	logKeys        bool
}

func defaultSettings() settings {
	return settings{ttl: DefaultTTL, autoRenew: true, releaseTimeout: DefaultReleaseTimeout, logKeys: true}
}

// WithTTL sets how long the backend keeps a lock whose holder stops renewing
// it; ≤ 0 is [ErrInvalidOption]. Default [DefaultTTL]; DSN parameter "ttl".
func WithTTL(ttl time.Duration) LeaseOption {
	return LeaseOption{func(s *settings) { s.ttl = ttl }}
}

// WithAutoRenew turns the keepalive on or off: on, each lease renews at TTL/3
// and ends ([ErrLeaseLost]) at the first renewal that fails in time; off, it
// ends at its Deadline unless Refreshed. Default on; DSN parameter "autorenew".
func WithAutoRenew(on bool) LeaseOption {
	return LeaseOption{func(s *settings) { s.autoRenew = on }}
}

// WithReleaseTimeout bounds a release whose ctx is done or has no deadline
// (Do's, Close's, a lost lease's clean-up): it gets at least d, at most d·9/8.
// Default [DefaultReleaseTimeout] (5s); a d ≤ 0 is [ErrInvalidOption].
func WithReleaseTimeout(d time.Duration) LeaseOption {
	return LeaseOption{func(s *settings) { s.releaseTimeout = d }}
}

// withLocker returns s with a Locker's options applied, or an error
// matching ErrInvalidOption.
func (s settings) withLocker(opts []Option) (settings, error) {
	for _, o := range opts {
		if o != nil {
			o.applyLocker(&s)
		}
	}
	return s.check()
}

// withAcquire returns s with an acquire's options applied, or an error
// matching ErrInvalidOption.
func (s settings) withAcquire(opts []AcquireOption) (settings, error) {
	for _, o := range opts {
		if o != nil {
			o.applyAcquire(&s)
		}
	}
	return s.check()
}

// check returns s, its label defaulted, or an error matching
// ErrInvalidOption for a value or a combination that makes no sense.
func (s settings) check() (settings, error) {
	if s.ttl <= 0 {
		return s, fmt.Errorf("%w: ttl must be > 0, got %v", ErrInvalidOption, s.ttl)
	}
	if s.releaseTimeout <= 0 {
		return s, fmt.Errorf("%w: release timeout must be > 0, got %v", ErrInvalidOption, s.releaseTimeout)
	}
	if s.permits < 0 {
		return s, fmt.Errorf("%w: permits must be > 0, got %d", ErrInvalidOption, s.permits)
	}
	if s.permits > 0 && s.shared {
		return s, fmt.Errorf("%w: a counted acquire cannot be shared", ErrInvalidOption)
	}
	if !s.labelSet {
		s.label = DefaultLabel
	}
	if err := checkLabel(s.label); err != nil {
		return s, err
	}
	return s, nil
}

// takePortableParams removes dlock's own parameters from u's query and returns
// them as options.
func takePortableParams(u *url.URL) ([]Option, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		// url.Values would drop the pairs it cannot read, settings the
		// user meant.
		return nil, fmt.Errorf("%w: DSN query: %w", ErrInvalidOption, err)
	}
	var opts []Option
	if vs, ok := q["ttl"]; ok {
		d, err := time.ParseDuration(vs[len(vs)-1])
		if err != nil || d <= 0 || len(vs) > 1 {
			return nil, fmt.Errorf("%w: DSN parameter ttl=%q: want one positive duration such as 10s", ErrInvalidOption, vs[len(vs)-1])
		}
		opts = append(opts, WithTTL(d))
		q.Del("ttl")
	}
	if vs, ok := q["autorenew"]; ok {
		b, err := strconv.ParseBool(vs[len(vs)-1])
		if err != nil || len(vs) > 1 {
			return nil, fmt.Errorf("%w: DSN parameter autorenew=%q: want true or false", ErrInvalidOption, vs[len(vs)-1])
		}
		opts = append(opts, WithAutoRenew(b))
		q.Del("autorenew")
	}
	if vs, ok := q["label"]; ok {
		if len(vs) > 1 {
			return nil, fmt.Errorf("%w: DSN parameter label given %d times", ErrInvalidOption, len(vs))
		}
		opts = append(opts, WithLabel(vs[0]))
		q.Del("label")
	}
	if vs, ok := q["reentrant"]; ok {
		b, err := strconv.ParseBool(vs[len(vs)-1])
		if err != nil || len(vs) > 1 {
			return nil, fmt.Errorf("%w: DSN parameter reentrant=%q: want true or false", ErrInvalidOption, vs[len(vs)-1])
		}
		if b {
			opts = append(opts, WithReentrant())
		}
		q.Del("reentrant")
	}
	u.RawQuery = q.Encode()
	return opts, nil
}

// validateKey reports why key cannot name a lock.
func validateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes long, the maximum is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: contains a NUL byte at offset %d", ErrInvalidKey, i)
		}
	}
	return nil
}
