package migrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// DefaultMargin is what Switch adds, in microseconds, to the old backend's
// probe token to make the base: it covers clock differences between Redis
// servers, and fences off an old-only client left running for that long.
const DefaultMargin = 24 * time.Hour

// ProbeKey is the key Switch locks on the old backend to read its clock
// through a token. On Redis it leaves one fence counter behind
// ("<prefix>{.dlock-migrate-probe}:fence").
const ProbeKey = ".dlock-migrate-probe"

// SwitchOptions tune Switch. The zero value, or nil, gives the defaults.
type SwitchOptions struct {
	// Margin is added to the probe token. Zero means DefaultMargin (24h);
	// negative is an error.
	Margin time.Duration

	// Base, if non-zero, is recorded as the base without probing, and must be
	// above every token the old backend has given; it is required for an old
	// backend other than Redis, whose tokens are not floored at a clock.
	Base uint64
}

// clockFloored reports whether a scheme's tokens are floored at the server's
// clock in µs, so that one probe token bounds every key's tokens.
func clockFloored(scheme string) bool {
	switch scheme {
	case "redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster":
		return true
	}
	return false
}

// Switch records, within ctx, the token switch in the new backend to for the
// old backend from, with base = a probe token of ProbeKey + o.Margin unless
// o.Base is set; run it once no old-only client is left. It is idempotent
// (created false) and fails with ErrMismatch if the record names another old
// backend.
func Switch(ctx context.Context, from, to string, o *SwitchOptions) (rec *Record, created bool, err error) {
	var opt SwitchOptions
	if o != nil {
		opt = *o
	}
	switch {
	case opt.Margin == 0:
		opt.Margin = DefaultMargin
	case opt.Margin < 0:
		return nil, false, fmt.Errorf("%w: negative margin %v", dlock.ErrInvalidOption, opt.Margin)
	}
	fu, err := parseInner("from", from)
	if err != nil {
		return nil, false, err
	}
	tu, err := parseInner("to", to)
	if err != nil {
		return nil, false, err
	}
	if opt.Base == 0 && !clockFloored(fu.Scheme) {
		return nil, false, fmt.Errorf("%w: the old backend %s:// does not floor its tokens at a clock, so its tokens cannot be bounded by probing: give a base above every token it has given",
			dlock.ErrInvalidOption, fu.Scheme)
	}
	s, err := openStore(ctx, tu)
	if err != nil {
		return nil, false, err
	}
	defer s.close()
	id := backendID(fu)
	cur, err := s.readSwitch(ctx)
	switch {
	case err == nil:
		return cur, false, cur.check(id)
	case !errors.Is(err, ErrNotSwitched):
		return nil, false, err
	}

	base := opt.Base
	var old dlock.Locker
	if base == 0 {
		if old, err = dlock.Open(ctx, fu.String()); err != nil {
			return nil, false, fmt.Errorf("old backend: %w", err)
		}
		defer old.Close()
		t, err := probe(ctx, old)
		if err != nil {
			return nil, false, err
		}
		m := uint64(opt.Margin.Microseconds())
		if t > math.MaxUint64/2-m {
			return nil, false, fmt.Errorf("%w: probe token %d leaves no room for new tokens", ErrTokenBackwards, t)
		}
		base = t + m
	}
	rec, created, err = s.createSwitch(ctx, &Record{Version: RecordVersion, From: id, Base: base, At: time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return nil, false, err
	}
	if !created {
		return rec, false, rec.check(id) // another operator was quicker
	}
	if old != nil {
		t, err := probe(ctx, old)
		if err != nil {
			return rec, true, fmt.Errorf("switch recorded, but the check after it failed: %w", err)
		}
		if t >= base {
			return rec, true, fmt.Errorf("%w: switch recorded with base %d, but the old backend's clock already gives %d: its clock jumped, or the switch took longer than the margin %v",
				ErrTokenBackwards, base, t, opt.Margin)
		}
	}
	return rec, true, nil
}

// parseInner parses a backend's DSN given to Switch or ReadSwitch, where
// dlock's own parameters (ttl, autorenew, label, reentrant) may stay (unlike
// in a migrate:// DSN): they change nothing here.
func parseInner(which, dsn string) (*url.URL, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %s DSN: %w", dlock.ErrInvalidOption, which, err)
	}
	if u.Scheme == Scheme {
		return nil, fmt.Errorf("%w: %s DSN: want the %s backend's own DSN, not a migrate:// one", dlock.ErrInvalidOption, which, map[string]string{"from": "old", "to": "new"}[which])
	}
	return u, nil
}

// probe locks ProbeKey on old and returns the token.
func probe(ctx context.Context, old dlock.Locker) (uint64, error) {
	lease, err := old.Acquire(ctx, ProbeKey)
	if err != nil {
		return 0, fmt.Errorf("old backend: probe its clock: %w", err)
	}
	t := uint64(lease.Token())
	if err := lease.Release(ctx); err != nil {
		return 0, fmt.Errorf("old backend: probe its clock: %w", err)
	}
	return t, nil
}

// ReadSwitch returns the switch record in the new backend of the DSN to, or
// an error matching ErrNotSwitched if there is none. Errors never contain the
// DSN's password.
func ReadSwitch(ctx context.Context, to string) (*Record, error) {
	tu, err := parseInner("to", to)
	if err != nil {
		return nil, err
	}
	s, err := openStore(ctx, tu)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.readSwitch(ctx)
}
