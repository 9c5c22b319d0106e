package dlock

import (
	"errors"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/backend"
)

// Sentinel errors. Every error dlock returns is an *Error whose chain contains
// one of these (match with errors.Is), and, where there was one, the underlying
// cause: a context error, a backend error, a network error.
var (
	// ErrNotAcquired means the lock was not granted: TryAcquire found it held, or
	// Acquire's ctx ended while waiting (then the error also matches ctx.Err(),
	// e.g. context.DeadlineExceeded).
	ErrNotAcquired = errors.New("lock not acquired")

	// ErrLeaseLost means a lease ended without being released by its holder: it
	// expired, the backend dropped it, or a refresh failed. Exclusivity may have
	// broken: another owner may hold the lock, or may have held it, since.
	ErrLeaseLost = errors.New("lease lost")

	// ErrReleased means the lease was already released (by Release, or by
	// Locker.Close).
	ErrReleased = errors.New("lease already released")

	// ErrClosed means the Locker was closed: every call after Close, a second
	// Close, and an Acquire that was waiting when Close came return it. It is
	// backend.ErrClosed, which drivers wrap.
	ErrClosed = backend.ErrClosed

	// ErrInvalidKey means a key is empty, longer than MaxKeyLen bytes, not valid
	// UTF-8, or contains a NUL byte.
	ErrInvalidKey = errors.New("invalid key")

	// ErrInvalidOption means an option or DSN parameter has a value that makes no
	// sense, such as a TTL ≤ 0, or names something unknown. It is
	// backend.ErrInvalidOption, which drivers wrap.
	ErrInvalidOption = backend.ErrInvalidOption

	// ErrNotHeld means Break found nobody holding the key. It is
	// backend.ErrNotHeld, which drivers wrap.
	ErrNotHeld = backend.ErrNotHeld

	// ErrUpgrade means an exclusive acquire of a key was asked for, with
	// WithReentrant, under a ctx that carries a shared hold of that key
	// (package rwlock's read holds): it would wait for its own shared hold
	// for ever. Release the shared hold first; the opposite (a shared
	// acquire under an exclusive hold) is a nested hold of the exclusive
	// lease.
	ErrUpgrade = errors.New("an exclusive acquire under a shared hold of the same key would wait for itself")

	// ErrLockOrder means AcquireAll was asked, with WithReentrant, for a set
	// of which ctx already holds a key that sorts above a key still to take:
	// waiting for that key out of order could deadlock with another
	// AcquireAll of the same keys. Nothing was taken. Take the held key in
	// the same AcquireAll as the rest, or use TryAcquireAll.
	ErrLockOrder = errors.New("keys taken out of sorted order")

	// ErrSizeMismatch means a counted acquire (package semaphore's permits) found a holder
	// of the semaphore that uses another number of permits; nothing was
	// granted. It is backend.ErrSizeMismatch, which drivers wrap, and
	// package semaphore's ErrSizeMismatch.
	ErrSizeMismatch = backend.ErrSizeMismatch

	// ErrUnknownScheme means Open was given a DSN whose scheme no imported driver
	// registered. The message lists the registered schemes.
	ErrUnknownScheme = errors.New("unknown DSN scheme")
)

// Error is the type of every error dlock returns. It says which operation on
// which key of which backend failed; Err holds the reason, and errors.Is and
// errors.As see through it.
//
// Its message reads like
//
//	dlock: acquire "jobs/nightly" (redis): lock not acquired: lock held by another owner
type Error struct {
	Op      string // "open", "acquire", "try-acquire", "refresh", "release", "close", "renew", "inspect", "list", "break", …
	Key     string // empty for operations on the Locker as a whole
	Backend string // the DSN scheme or driver name
	Err     error
}

// Error formats the error as "dlock: OP "KEY" (BACKEND): CAUSE".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("dlock: ")
	b.WriteString(e.Op)
	if e.Key != "" {
		b.WriteByte(' ')
		key := e.Key
		if len(key) > 64 {
			key = key[:64] + "…"
		}
		b.WriteString(strconv.Quote(key))
	}
	if e.Backend != "" {
		b.WriteString(" (")
		b.WriteString(e.Backend)
		b.WriteByte(')')
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// kindError pairs a sentinel with its cause, so the error matches both and reads
// "<sentinel>: <cause>".
type kindError struct {
	kind, cause error
}

func (e *kindError) Error() string {
	if e.cause == nil {
		return e.kind.Error()
	}
	return e.kind.Error() + ": " + e.cause.Error()
}

func (e *kindError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// withKind returns an error matching kind and cause. If cause already matches
// kind it is returned unchanged.
func withKind(kind, cause error) error {
	if cause == nil {
		return kind
	}
	if errors.Is(cause, kind) {
		return cause
	}
	return &kindError{kind: kind, cause: cause}
}
