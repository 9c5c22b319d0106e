package sqltable

import (
	"context"

	"github.com/dlock-go/dlock/backend"
)

// Orphan implements backend.Orphaner. A table lock is a row with an expiry
// that the driver keeps no state for, so there is nothing to do: the row is
// the holder's until its expiry, set by the last grant or renewal.
func (d *Driver) Orphan(_ context.Context, _ *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	return nil
}
