package memlock

import (
	"context"

	"github.com/dlock-go/dlock/backend"
)

// Orphan implements backend.Orphaner: the Store keeps the lock until its
// expiry, as it does for a holder that stops renewing; the Store, not the
// driver, holds it, so closing the driver leaves it in place.
func (d *driver) Orphan(_ context.Context, _ *backend.Grant) error {
	if d.closed() {
		return errClosed
	}
	return nil
}
