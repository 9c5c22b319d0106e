package migrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	_ "github.com/dlock-go/dlock/redis" // the usual old backend: redis://, rediss://, …
)

func init() { backend.Register(Scheme, open) }

// driver is the backend.Driver behind a migrate:// DSN. dlock.Open wraps it in
// the portable Locker, so users get an ordinary *dlock.Lease with keepalive,
// Done and Err.
type driver struct {
	name  string // for errors: "migrate(redis→etcd)"
	mode  string
	from  string       // BackendID of the old backend; "" for new-only without from
	old   dlock.Locker // nil in ModeNew
	new   dlock.Locker
	store store
	caps  backend.Capabilities

	wg sync.WaitGroup // loss watchers, one per held grant
}

var (
	_ backend.Driver = (*driver)(nil)
	_ backend.Named  = (*driver)(nil)
)

// pair is a grant's driver-private data: the two inner leases.
type pair struct {
	old, new *dlock.Lease // old is nil in ModeNew
}

// open is the OpenFunc of the scheme "migrate".
func open(ctx context.Context, u *url.URL) (_ backend.Driver, err error) {
	p := backend.NewParams(u)
	fromDSN, toDSN, mode := p.String("from", ""), p.String("to", ""), p.String("mode", ModeMigrate)
	if err := p.Done(); err != nil {
		return nil, err
	}
	if u.Host != "" || strings.Trim(u.Path, "/") != "" || u.Opaque != "" || u.User != nil {
		return nil, fmt.Errorf("%w: a migrate DSN has no host or path: migrate://?from=OLD&to=NEW[&mode=new], with OLD and NEW URL-escaped", dlock.ErrInvalidOption)
	}
	if mode != ModeMigrate && mode != ModeNew {
		return nil, fmt.Errorf("%w: parameter mode=%q: want %q or %q", dlock.ErrInvalidOption, mode, ModeMigrate, ModeNew)
	}
	if toDSN == "" {
		return nil, fmt.Errorf("%w: parameter \"to\" (the new backend's DSN) is missing", dlock.ErrInvalidOption)
	}
	if fromDSN == "" && mode == ModeMigrate {
		return nil, fmt.Errorf("%w: parameter \"from\" (the old backend's DSN) is missing; only mode=new runs without it", dlock.ErrInvalidOption)
	}
	to, err := innerDSN("to", toDSN)
	if err != nil {
		return nil, err
	}
	d := &driver{mode: mode}
	var from *url.URL
	if fromDSN != "" {
		if from, err = innerDSN("from", fromDSN); err != nil {
			return nil, err
		}
		d.from = backendID(from)
	}
	if mode == ModeNew {
		d.name = "migrate(new-only→" + to.Scheme + ")"
	} else {
		d.name = "migrate(" + from.Scheme + "→" + to.Scheme + ")"
	}

	if d.store, err = openStore(ctx, to); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = d.Close()
		}
	}()
	// Refuse at once what a grant would refuse: a new-only client before the
	// switch, and a record for another old backend.
	rec, err := d.store.readSwitch(ctx)
	switch {
	case errors.Is(err, ErrNotSwitched) && mode == ModeMigrate:
	case err != nil:
		return nil, err
	default:
		if err := rec.check(d.from); err != nil {
			return nil, err
		}
	}
	// Each inner lock is renewed by its own Locker's keepalive, so the old lock
	// stays held while an Acquire waits for the new one.
	if d.new, err = dlock.Open(ctx, to.String()); err != nil {
		return nil, fmt.Errorf("new backend: %w", inner(err))
	}
	d.caps = d.new.Capabilities()
	// The inner locks are taken exclusive and uncounted (neither
	// AcquireRequest.Shared nor Permits is passed on): claim no shared locks
	// and no counted semaphores, even where the new backend has them (etcd),
	// so that dlock refuses shared and counted acquires, and rwlock and
	// semaphore use their portable layouts.
	d.caps.Shared, d.caps.NativeSemaphore = false, false
	if mode == ModeMigrate {
		if d.old, err = dlock.Open(ctx, from.String()); err != nil {
			return nil, fmt.Errorf("old backend: %w", inner(err))
		}
		d.caps = weaker(d.old.Capabilities(), d.caps)
	}
	return d, nil
}

// innerDSN parses the old or new backend's DSN.
func innerDSN(which, dsn string) (*url.URL, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: parameter %q: %w", dlock.ErrInvalidOption, which, err)
	}
	if u.Scheme == Scheme {
		return nil, fmt.Errorf("%w: parameter %q: a migrate DSN cannot nest another", dlock.ErrInvalidOption, which)
	}
	q := u.Query()
	for _, name := range backend.PortableParams {
		if q.Has(name) {
			return nil, fmt.Errorf("%w: parameter %q: put %s=%s on the migrate:// DSN, which applies it to both locks",
				dlock.ErrInvalidOption, which, name, q.Get(name))
		}
	}
	return u, nil
}

// weaker returns the capabilities that hold when both a and b must.
func weaker(a, b backend.Capabilities) backend.Capabilities {
	c := backend.Capabilities{
		Fencing:       min(a.Fencing, b.Fencing),
		FIFO:          a.FIFO && b.FIFO,
		FaultTolerant: a.FaultTolerant && b.FaultTolerant,
		TimeAuthority: backend.TimeServer,
		PushWait:      a.PushWait && b.PushWait,
		LossNotify:    a.LossNotify && b.LossNotify,
	}
	if a.TimeAuthority == backend.TimeClient || b.TimeAuthority == backend.TimeClient {
		c.TimeAuthority = backend.TimeClient
	}
	return c
}

// Name returns the name used in errors, such as "migrate(redis→etcd)".
func (d *driver) Name() string { return d.name }

// Capabilities returns the weaker of the two backends' (the new backend's in
// ModeNew).
func (d *driver) Capabilities() backend.Capabilities { return d.caps }

// Acquire takes the old lock, then the new one, then picks the token.
func (d *driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	p := &pair{}
	ok := false
	defer func() {
		if !ok {
			d.releasePair(p)
		}
	}()
	var err error
	if d.old != nil {
		if p.old, err = acquire(ctx, d.old, req); err != nil {
			return nil, fmt.Errorf("old lock: %w", err)
		}
	}
	if p.new, err = acquire(ctx, d.new, req); err != nil {
		return nil, fmt.Errorf("new lock: %w", err)
	}
	token, err := d.token(ctx, req.Key, p)
	if err != nil {
		return nil, err
	}
	// A lock lost while the token was being read (a revoked lease, an
	// expired session) must not hand the token out.
	for _, l := range p.leases() {
		if err := l.Err(); err != nil {
			return nil, fmt.Errorf("%w: an inner lock was lost while the token was read: %w", backend.ErrNotHeld, err)
		}
	}
	start := time.Now()
	validity := p.deadline().Sub(start)
	if validity <= 0 {
		return nil, fmt.Errorf("%w: the locks' validity ran out before the token was read", backend.ErrNotHeld)
	}
	lost := make(chan struct{})
	var oldDone <-chan struct{} // nil in ModeNew: never ready
	if p.old != nil {
		oldDone = p.old.Done()
	}
	newDone := p.new.Done()
	d.wg.Go(func() {
		defer close(lost)
		select {
		case <-oldDone:
		case <-newDone:
		}
	})
	ok = true
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    token,
		Start:    start,
		Validity: validity,
		Lost:     lost,
		Data:     p,
	}, nil
}

// acquire takes one inner lock, as the request asks.
func acquire(ctx context.Context, l dlock.Locker, req backend.AcquireRequest) (*dlock.Lease, error) {
	var lease *dlock.Lease
	var err error
	if req.Wait {
		lease, err = l.Acquire(ctx, req.Key, dlock.WithTTL(req.TTL))
	} else {
		lease, err = l.TryAcquire(ctx, req.Key, dlock.WithTTL(req.TTL))
	}
	if err != nil {
		if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
			return nil, fmt.Errorf("%w (%w)", backend.ErrHeld, inner(err))
		}
		return nil, inner(err)
	}
	return lease, nil
}

// inner strips the "dlock: op "key"" prefix of an inner Locker's error, which
// the outer Locker adds again; it names the inner backend instead.
func inner(err error) error {
	var de *dlock.Error
	if errors.As(err, &de) && de.Err != nil {
		return fmt.Errorf("%s: %w", de.Backend, de.Err)
	}
	return err
}

// token picks the grant's fencing token while p holds both locks.
func (d *driver) token(ctx context.Context, key string, p *pair) (uint64, error) {
	st, err := d.store.read(ctx, key)
	if err != nil {
		return 0, err
	}
	if st.rec == nil {
		if p.old == nil {
			return 0, ErrNotSwitched
		}
		return uint64(p.old.Token()), nil
	}
	if err := st.rec.check(d.from); err != nil {
		return 0, err
	}
	base := max(st.rec.Base, st.base)
	if p.old != nil {
		if old := uint64(p.old.Token()); old >= base {
			// The old backend's counter is ahead of the recorded base (a clock
			// that stepped back, a failover): raise this key's base above it.
			if err := d.store.setBase(ctx, key, old, st.baseRev); err != nil {
				return 0, err
			}
			base = old
		}
	}
	n := uint64(p.new.Token())
	if n == 0 || n > math.MaxUint64-base {
		return 0, fmt.Errorf("%w: base %d + new token %d does not fit in 64 bits", ErrTokenBackwards, base, n)
	}
	t := base + n
	if p.old != nil && t <= uint64(p.old.Token()) {
		return 0, fmt.Errorf("%w: mapped token %d is not above the old lock's %s", ErrTokenBackwards, t, p.old.Token())
	}
	return t, nil
}

// deadline is the earlier of the inner leases' deadlines.
func (p *pair) deadline() time.Time {
	dl := p.new.Deadline()
	if p.old != nil {
		dl = minTime(dl, p.old.Deadline())
	}
	return dl
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// leases returns the held inner leases, new first (the release order).
func (p *pair) leases() []*dlock.Lease {
	var ls []*dlock.Lease
	for _, l := range []*dlock.Lease{p.new, p.old} {
		if l != nil {
			ls = append(ls, l)
		}
	}
	return ls
}

// releasePair releases what an Acquire that failed had taken.
func (d *driver) releasePair(p *pair) {
	ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
	defer cancel()
	for _, l := range p.leases() {
		_ = l.Release(ctx)
	}
}

// Refresh refreshes both inner leases and returns the validity left to the
// earlier of their deadlines.
func (d *driver) Refresh(ctx context.Context, g *backend.Grant, _ time.Duration) (time.Duration, error) {
	p, ok := g.Data.(*pair)
	if !ok {
		return 0, errors.New("migrate: grant from another driver")
	}
	ls := p.leases()
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() { errs[i] = l.Refresh(ctx) })
	}
	wg.Wait()
	if err := joinInner(errs); err != nil {
		return 0, err
	}
	v := time.Until(p.deadline())
	if v <= 0 {
		return 0, fmt.Errorf("%w: an inner lease's deadline passed", backend.ErrNotHeld)
	}
	return v, nil
}

// Release releases the new lock, then the old one.
func (d *driver) Release(ctx context.Context, g *backend.Grant) error {
	p, ok := g.Data.(*pair)
	if !ok {
		return errors.New("migrate: grant from another driver")
	}
	var errs []error
	for _, l := range p.leases() {
		errs = append(errs, l.Release(ctx))
	}
	return joinInner(errs)
}

// joinInner joins inner leases' errors; the result wraps backend.ErrNotHeld
// if either lease was lost (or had ended).
func joinInner(errs []error) error {
	var out []error
	notHeld := false
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, dlock.ErrLeaseLost) || errors.Is(err, dlock.ErrReleased) {
			notHeld = true
		}
		out = append(out, inner(err))
	}
	if len(out) == 0 {
		return nil
	}
	err := errors.Join(out...)
	if notHeld {
		return fmt.Errorf("%w: %w", backend.ErrNotHeld, err)
	}
	return err
}

// Close closes both inner Lockers (releasing what they hold), waits for the
// loss watchers, and closes the store's connection.
func (d *driver) Close() error {
	var errs []error
	for _, l := range []dlock.Locker{d.new, d.old} {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	d.wg.Wait()
	if d.store != nil {
		errs = append(errs, d.store.close())
	}
	return errors.Join(errs...)
}
