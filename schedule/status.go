package schedule

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock"
)

// Func is the work of a run or of Once. Its ctx is cancelled, with the
// lease's error as its cause (matching dlock.ErrLeaseLost), the moment the
// lease is lost; send lease.Token() with every write to the resource it
// changes, so that a late write from a broken holder is refused.
type Func func(ctx context.Context, lease *dlock.Lease) error

// Status says what became of a call to Run or Once.
type Status int

// The statuses.
const (
	// Ran: this call ran the work, to completion if the error is nil.
	Ran Status = iota + 1

	// Done: a record says the work was done (by Once, or by a run of Run:
	// completed, or in Mode NotRepeated claimed); this call did not run it.
	Done

	// InProgress: another holder is running the work (for Run: held the
	// job, or an earlier run's AtLeast hold, for all of RetryWithin); this
	// call did not run it.
	InProgress

	// Redo: the work did not complete (its error, or its lease was lost):
	// nothing records it as done, and the next call runs it again.
	Redo
)

// String returns the status's name in lower case: "ran", "done",
// "in progress", "redo".
func (s Status) String() string {
	switch s {
	case Ran:
		return "ran"
	case Done:
		return "done"
	case InProgress:
		return "in progress"
	case Redo:
		return "redo"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Result is what Run and Once report beside their error.
type Result struct {
	// Status says what became of the call.
	Status Status

	// Token is the fencing token of the run this call made (Ran, Redo), or
	// of the run the record names (Done); 0 if unknown.
	Token dlock.Token

	// Holder is the label of the holder in progress (InProgress), where the
	// backend reports it.
	Holder string
}

// recordLabel is the label of a record written by a holder of token: it is
// what Inspect reads back (at most 128 bytes).
func recordLabel(state string, token dlock.Token) string {
	return state + " token=" + token.String()
}

// parseRecord returns the token a record's label names (0 if none).
func parseRecord(label string) dlock.Token {
	_, tok, ok := strings.Cut(label, " token=")
	if !ok {
		return 0
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return 0
	}
	return dlock.Token(n)
}

// errorf wraps err as the error of op on name, in the package's one prefix.
func errorf(op, name string, err error) error {
	return fmt.Errorf("schedule: %s %q: %w", op, name, err)
}
