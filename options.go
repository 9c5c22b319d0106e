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

// Defaults. Every one can be changed per Locker (options to Open or New, or DSN
// parameters) and per lease (options to Acquire or TryAcquire).
const (
	// DefaultTTL is how long the backend keeps a lock whose holder stops renewing
	// it (see WithTTL).
	DefaultTTL = 15 * time.Second

	// DefaultReleaseTimeout bounds a release that runs on a detached context
	// (see WithReleaseTimeout).
	DefaultReleaseTimeout = 5 * time.Second

	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
)

// Option configures a Locker: give it to Open, New or a driver package's New.
// WithObserver, WithLogger and WithLogKeys are Locker options only; the
// lease options (a LeaseOption: WithTTL, WithLabel, …) are Options too, and
// set the default of every lease the Locker grants. An Option that is not
// also an AcquireOption cannot be given to Acquire: the compiler refuses it.
// A nil Option changes nothing.
type Option interface{ applyLocker(*settings) }

// AcquireOption configures one acquire: give it to Locker.Acquire,
// Locker.TryAcquire, Do, AcquireAll or TryAcquireAll (and the per-call
// options of packages semaphore, rwlock and election). It applies to that
// lease only and takes precedence over the Locker's default. A nil
// AcquireOption changes nothing.
type AcquireOption interface{ applyAcquire(*settings) }

// LeaseOption is an option of a lease, valid in both scopes: given to Open
// or New it sets the default of every lease of the Locker, given to an
// acquire it sets that lease's. WithTTL, WithAutoRenew, WithReleaseTimeout,
// WithLabel, WithReentrant and WithAnnounce return one; the zero LeaseOption
// changes nothing.
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

// WithTTL sets how long the backend keeps a lock whose holder stops renewing it:
// the longest time others wait for a holder that crashed. With auto-renew on
// (the default) a live holder renews every TTL/3, so the lease lasts until it is
// released. Default DefaultTTL (15s); DSN parameter "ttl". A TTL ≤ 0 is an error,
// never a silent default.
func WithTTL(ttl time.Duration) LeaseOption {
	return LeaseOption{func(s *settings) { s.ttl = ttl }}
}

// WithAutoRenew turns the keepalive on or off. When on (the default), one
// scheduler per Locker refreshes each lease every TTL/3; the first refresh that
// fails, or cannot finish before the lease's deadline, ends the lease (Done is
// closed, Err is ErrLeaseLost). When off, the lease ends at its Deadline unless
// the holder calls Refresh in time. DSN parameter "autorenew".
func WithAutoRenew(on bool) LeaseOption {
	return LeaseOption{func(s *settings) { s.autoRenew = on }}
}

// WithReleaseTimeout bounds a release that dlock runs on a detached context:
// when Release is called with a ctx that is already done, when Do releases
// after fn, when Close releases the leases it still holds, and when a lost lease
// is cleaned up. It also bounds Release called with a ctx that has no
// deadline. Default DefaultReleaseTimeout (5s). Releases whose ctx can never be
// cancelled (context.Background, say) share one deadline: each gets at least d
// and at most d·9/8.
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
