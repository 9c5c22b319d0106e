package dlock

import (
	"errors"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/backend"
)

// Sentinel errors. Every error dlock returns is an [*Error] matching one of
// these with errors.Is, and its cause (a context, backend or network error).
var (
	// ErrNotAcquired means the lock was not granted: TryAcquire found it held,
	// or Acquire's ctx ended while waiting (the error then matches ctx.Err()).
	ErrNotAcquired = errors.New("lock not acquired")

	// ErrLeaseLost means a lease ended without its holder releasing it: another
	// owner may have held the lock since.
	ErrLeaseLost = errors.New("lease lost")

	// ErrReleased means the lease was already released (by Release or Close).
	ErrReleased = errors.New("lease already released")

	// ErrClosed means the Locker is closed. It is [backend.ErrClosed].
	ErrClosed = backend.ErrClosed

	// ErrInvalidKey means a key is empty, longer than MaxKeyLen bytes, not valid
	// UTF-8, or contains a NUL byte.
	ErrInvalidKey = errors.New("invalid key")

	// ErrInvalidOption means an option or DSN parameter is unknown or has a value
	// that makes no sense, such as a TTL ≤ 0. It is [backend.ErrInvalidOption].
	ErrInvalidOption = backend.ErrInvalidOption

	// ErrNotHeld means Break found no holder. It is [backend.ErrNotHeld].
	ErrNotHeld = backend.ErrNotHeld

	// ErrUpgrade means a re-entrant exclusive acquire came under a ctx holding
	// the key shared (a rwlock read hold), and would wait for itself.
	ErrUpgrade = errors.New("an exclusive acquire under a shared hold of the same key would wait for itself")

	// ErrLockOrder means a re-entrant AcquireAll would wait for a key while ctx
	// holds one of the set that sorts above it; nothing was taken.
	ErrLockOrder = errors.New("keys taken out of sorted order")

	// ErrSizeMismatch means a semaphore holder uses another number of permits;
	// nothing was granted. It is [backend.ErrSizeMismatch].
	ErrSizeMismatch = backend.ErrSizeMismatch

	// ErrUnknownScheme means no imported driver registered the DSN's scheme.
	ErrUnknownScheme = errors.New("unknown DSN scheme")
)

// Error is the type of every error dlock returns, such as `dlock: acquire
// "jobs/nightly" (redis): lock not acquired`; errors.Is and errors.As see
// through it to Err.
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
