package redis

import (
	"context"

	"github.com/dlock-go/dlock/backend"
)

// Orphan implements backend.Orphaner. A Redis lock is a key with a PX expiry
// that the driver keeps no state for, so there is nothing to do: the key stays
// until its expiry, set by the last grant or renewal.
func (d *Driver) Orphan(_ context.Context, _ *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	return nil
}
