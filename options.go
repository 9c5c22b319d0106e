package dlock

import (
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"
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

// Option changes a setting. Options given to Open or New set the Locker's
// defaults; options given to Acquire, TryAcquire or Do apply to that lease only
// and take precedence.
type Option func(*settings)

type settings struct {
	ttl            time.Duration
	autoRenew      bool
	releaseTimeout time.Duration
	reentrant      bool
	shared         bool
	permits        int // WithPermits; 0: a lock
	announce       bool
	label          string
	labelSet       bool // label was given (WithLabel), "" included
	observer       Observer
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
func WithTTL(ttl time.Duration) Option {
	return func(s *settings) { s.ttl = ttl }
}

// WithAutoRenew turns the keepalive on or off. When on (the default), one
// scheduler per Locker refreshes each lease every TTL/3; the first refresh that
// fails, or cannot finish before the lease's deadline, ends the lease (Done is
// closed, Err is ErrLeaseLost). When off, the lease ends at its Deadline unless
// the holder calls Refresh in time. DSN parameter "autorenew".
func WithAutoRenew(on bool) Option {
	return func(s *settings) { s.autoRenew = on }
}

// WithReleaseTimeout bounds a release that dlock runs on a detached context:
// when Release is called with a ctx that is already done, when Do releases
// after fn, when Close releases the leases it still holds, and when a lost lease
// is cleaned up. It also bounds Release called with a ctx that has no
// deadline. Default DefaultReleaseTimeout (5s). Releases whose ctx can never be
// cancelled (context.Background, say) share one deadline: each gets at least d
// and at most d·9/8.
func WithReleaseTimeout(d time.Duration) Option {
	return func(s *settings) { s.releaseTimeout = d }
}

func (s settings) with(opts []Option) (settings, error) {
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
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
		return s, fmt.Errorf("%w: WithPermits and WithShared cannot be combined", ErrInvalidOption)
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
