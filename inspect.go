package dlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlock-go/dlock/backend"
)

// LockInfo is what a backend knows of one lock: who holds it (token, owner
// ID, label), since and until when, and how many wait for it. See
// backend.LockInfo for each field; Inspect, List and Break return it.
type LockInfo = backend.LockInfo

// WithLabel sets the label stored with each grant, which Inspect, List and
// `dlock ls` show as the holder: a name for people, such as a job or host
// name. At most backend.MaxLabelLen (128) bytes of printable UTF-8; "" stores
// none. Default "hostname:pid" of the process (DefaultLabel). Backends store
// it where they have room: the lock's value (Redis, etcd), node data
// (ZooKeeper, as Curator stores a participant's address), the session's
// application_name (PostgreSQL).
func WithLabel(label string) LeaseOption {
	return LeaseOption{func(s *settings) { s.label, s.labelSet = label, true }}
}

// DefaultLabel is the label stored with grants unless WithLabel says
// otherwise: "hostname:pid" of this process.
var DefaultLabel = defaultLabel()

func defaultLabel() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	l := host + ":" + strconv.Itoa(os.Getpid())
	if checkLabel(l) != nil {
		return "pid:" + strconv.Itoa(os.Getpid())
	}
	return l
}

// checkLabel reports why label cannot be stored.
func checkLabel(label string) error {
	switch {
	case len(label) > backend.MaxLabelLen:
		return fmt.Errorf("%w: label is %d bytes, at most %d", ErrInvalidOption, len(label), backend.MaxLabelLen)
	case !utf8.ValidString(label):
		return fmt.Errorf("%w: label is not valid UTF-8", ErrInvalidOption)
	case strings.IndexFunc(label, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("%w: label %q has a character that is not printable", ErrInvalidOption, label)
	}
	return nil
}

// Inspector is implemented by every Locker that Open and New return: it
// reports the state of locks (see the package-level Inspect and List, which
// are the way to call it). A Locker that wraps another can implement it by
// forwarding to dlock.Inspect and dlock.List.
type Inspector interface {
	Inspect(ctx context.Context, key string) (LockInfo, error)
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Breaker is implemented by every Locker that Open and New return: it
// force-releases locks (see the package-level Break). A Locker that wraps
// another can implement it by forwarding to dlock.Break.
type Breaker interface {
	Break(ctx context.Context, key string) (LockInfo, error)
}

// Watcher is implemented by a Locker whose backend reports changes of locks
// as they happen (see the package-level Watch). A Locker that wraps another
// can implement it by forwarding to dlock.Watch.
type Watcher interface {
	Watch(ctx context.Context, key string, changed func()) error
}

// Unwrapper is implemented by a Locker that wraps another and passes keys to
// it unchanged (one that adds metrics or retries, say): Unwrap returns the
// Locker it wraps. Package rwlock compares Lockers unwrapped, so that it
// refuses a hold nested in a hold of the same lock (rwlock.ErrNested)
// through such a wrapper whatever its type. A wrapper that changes keys (adds
// a prefix, say) must not implement it.
type Unwrapper interface {
	Unwrap() Locker
}

// errUnsupported wraps errors.ErrUnsupported for a Locker whose backend
// cannot do op.
func errUnsupported(backendName, op, what string) error {
	return &Error{Op: op, Backend: backendName, Err: fmt.Errorf("the backend cannot %s: %w", what, errors.ErrUnsupported)}
}

// Inspect reports the state of key's lock on l's backend: whether it is
// held, by whom (token, owner ID, label), since and until when, and how many
// wait for it. It sees every client's locks. A lock nobody holds is not an
// error. A backend that cannot report its locks returns an error matching
// errors.ErrUnsupported.
func Inspect(ctx context.Context, l Locker, key string) (LockInfo, error) {
	in, ok := l.(Inspector)
	if !ok {
		return LockInfo{}, errUnsupported(fmt.Sprintf("%T", l), "inspect", "report its locks")
	}
	return in.Inspect(ctx, key)
}

// List reports the locks held on l's backend whose keys start with prefix
// ("" for all), in key order, with their holders. It sees every client's
// locks under the backend's namespace (the driver's prefix, database or
// path). A backend that cannot list its locks returns an error matching
// errors.ErrUnsupported.
func List(ctx context.Context, l Locker, prefix string) ([]LockInfo, error) {
	in, ok := l.(Inspector)
	if !ok {
		return nil, errUnsupported(fmt.Sprintf("%T", l), "list", "report its locks")
	}
	return in.List(ctx, prefix)
}

// Break force-releases key's lock, whoever holds it, and returns what it
// broke. The broken holder learns it at its next renewal at the latest (at
// once where the backend reports loss), and its lease then ends with
// ErrLeaseLost; the next grant of key gets a higher token, so a fencing
// guard rejects the broken holder's writes once the next holder has
// written. Breaking never makes two holders look legitimate to a resource
// that checks tokens — but a holder that does not check Done may go on
// working: break only a holder you know to be stuck.
//
// It returns an error matching ErrNotHeld if nobody holds key, and one
// matching errors.ErrUnsupported if the backend cannot break locks.
func Break(ctx context.Context, l Locker, key string) (LockInfo, error) {
	br, ok := l.(Breaker)
	if !ok {
		return LockInfo{}, errUnsupported(fmt.Sprintf("%T", l), "break", "break locks")
	}
	return br.Break(ctx, key)
}

// Watch calls changed each time key's lock on l's backend may have changed
// (a grant, a release, an expiry, a waiter arriving or leaving), from one
// goroutine, until ctx ends or l is closed; it returns once the watch is in
// place. Calls may be spurious; a grant right after a release may be
// reported only as the release, so read the state again shortly after a
// call that finds nobody holding the lock. Some changes are not pushed: an
// expiry on Redis and Redlock, and on PostgreSQL anything but the grants,
// relabels and releases of leases taken WithAnnounce and its own breaks;
// read again where that matters. Where the backend cannot push changes at
// all (MySQL, the table locks), it returns an error matching
// errors.ErrUnsupported: poll Inspect instead.
func Watch(ctx context.Context, l Locker, key string, changed func()) error {
	w, ok := l.(Watcher)
	if !ok {
		return errUnsupported(fmt.Sprintf("%T", l), "watch", "report changes as they happen")
	}
	return w.Watch(ctx, key, changed)
}

// WithAnnounce asks the backend to announce the lease's grant, its label's
// changes (Lease.SetLabel) and its release to the followers of its key
// (Watch; package election's Observe) where announcing costs something per
// grant: on PostgreSQL a NOTIFY after each, a statement of its own whose
// commit is flushed to disk. The backends that announce every change anyway
// (etcd, ZooKeeper, Redis, Redlock) ignore it. Package election's Campaign
// sets it. Off by default; given to Open or New it applies to every acquire.
func WithAnnounce() LeaseOption {
	return LeaseOption{func(s *settings) { s.announce = true }}
}

func (l *locker) Watch(ctx context.Context, key string, changed func()) error {
	w, ok := l.drv.(backend.Watcher)
	if !ok {
		return errUnsupported(l.name, "watch", "report changes as they happen")
	}
	if err := validateKey(key); err != nil {
		return l.errorf("watch", key, err)
	}
	if !l.enter() {
		return l.errorf("watch", key, ErrClosed)
	}
	defer l.inflight.Done()
	if err := w.Watch(ctx, key, changed); err != nil {
		return l.errorf("watch", key, err)
	}
	return nil
}

func (l *locker) Inspect(ctx context.Context, key string) (LockInfo, error) {
	in, ok := l.drv.(backend.Inspector)
	if !ok {
		return LockInfo{}, errUnsupported(l.name, "inspect", "report its locks")
	}
	if err := validateKey(key); err != nil {
		return LockInfo{}, l.errorf("inspect", key, err)
	}
	if !l.enter() {
		return LockInfo{}, l.errorf("inspect", key, ErrClosed)
	}
	defer l.inflight.Done()
	info, err := in.Inspect(ctx, key)
	if err != nil {
		return LockInfo{}, l.errorf("inspect", key, err)
	}
	return info, nil
}

func (l *locker) List(ctx context.Context, prefix string) ([]LockInfo, error) {
	in, ok := l.drv.(backend.Inspector)
	if !ok {
		return nil, errUnsupported(l.name, "list", "report its locks")
	}
	if !l.enter() {
		return nil, l.errorf("list", prefix, ErrClosed)
	}
	defer l.inflight.Done()
	infos, err := in.List(ctx, prefix)
	if err != nil {
		return nil, l.errorf("list", prefix, err)
	}
	return infos, nil
}

func (l *locker) Break(ctx context.Context, key string) (LockInfo, error) {
	br, ok := l.drv.(backend.Breaker)
	if !ok {
		return LockInfo{}, errUnsupported(l.name, "break", "break locks")
	}
	if err := validateKey(key); err != nil {
		return LockInfo{}, l.errorf("break", key, err)
	}
	if !l.enter() {
		return LockInfo{}, l.errorf("break", key, ErrClosed)
	}
	defer l.inflight.Done()
	info, err := br.Break(ctx, key)
	if err != nil {
		return LockInfo{}, l.errorf("break", key, err)
	}
	return info, nil
}
