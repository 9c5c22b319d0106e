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

// LockInfo is what a backend knows of one lock, as Inspect, List and Break
// return it; [backend.LockInfo] documents the fields.
type LockInfo = backend.LockInfo

// WithLabel sets the holder's name for people, stored with each grant and
// shown by Inspect: at most [backend.MaxLabelLen] bytes of printable UTF-8
// ("" for none). Default [DefaultLabel]; DSN parameter "label".
func WithLabel(label string) LeaseOption {
	return LeaseOption{func(s *settings) { s.label, s.labelSet = label, true }}
}

// DefaultLabel is the label of grants without WithLabel: "hostname:pid".
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

// Inspector, behind [Inspect] and [List], is implemented by Open's and New's
// Lockers.
type Inspector interface {
	Inspect(ctx context.Context, key string) (LockInfo, error)
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Breaker, behind [Break], is implemented by Open's and New's Lockers.
type Breaker interface {
	Break(ctx context.Context, key string) (LockInfo, error)
}

// Watcher, behind [Watch], is implemented by Open's and New's Lockers.
type Watcher interface {
	Watch(ctx context.Context, key string, changed func()) error
}

// Unwrapper is implemented by a wrapper that passes keys to the Locker it
// wraps unchanged, which Unwrap returns; one that changes keys must not.
type Unwrapper interface {
	Unwrap() Locker
}

// errUnsupported wraps errors.ErrUnsupported for a Locker whose backend
// cannot do op.
func errUnsupported(backendName, op, what string) error {
	return &Error{Op: op, Backend: backendName, Err: fmt.Errorf("the backend cannot %s: %w", what, errors.ErrUnsupported)}
}

// Inspect reports the state of key's lock on l's backend, whoever holds it
// (not held is no error); errors.ErrUnsupported where l cannot report locks.
func Inspect(ctx context.Context, l Locker, key string) (LockInfo, error) {
	in, ok := l.(Inspector)
	if !ok {
		return LockInfo{}, errUnsupported(fmt.Sprintf("%T", l), "inspect", "report its locks")
	}
	return in.Inspect(ctx, key)
}

// List reports the locks held on l's backend whose keys start with prefix,
// in key order; errors.ErrUnsupported where l cannot report locks.
func List(ctx context.Context, l Locker, prefix string) ([]LockInfo, error) {
	in, ok := l.(Inspector)
	if !ok {
		return nil, errUnsupported(fmt.Sprintf("%T", l), "list", "report its locks")
	}
	return in.List(ctx, prefix)
}

// Break force-releases key's lock and returns what it broke: the holder's
// lease ends with [ErrLeaseLost] by its next renewal, and the next token is
// higher. It returns [ErrNotHeld] if nobody held key, or errors.ErrUnsupported.
func Break(ctx context.Context, l Locker, key string) (LockInfo, error) {
	br, ok := l.(Breaker)
	if !ok {
		return LockInfo{}, errUnsupported(fmt.Sprintf("%T", l), "break", "break locks")
	}
	return br.Break(ctx, key)
}

// Watch calls changed, from one goroutine, whenever key's lock on l's backend
// may have changed, until ctx ends or l closes; it returns once watching.
// Calls may be spurious and some changes are not pushed (docs/guide.md); where
// none are, it returns errors.ErrUnsupported: poll Inspect instead.
func Watch(ctx context.Context, l Locker, key string, changed func()) error {
	w, ok := l.(Watcher)
	if !ok {
		return errUnsupported(fmt.Sprintf("%T", l), "watch", "report changes as they happen")
	}
	return w.Watch(ctx, key, changed)
}

// WithAnnounce makes the lease announce its changes to [Watch] on PostgreSQL
// too, at a NOTIFY each; the other backends always do. Default off.
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
