package rediscore

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
)

// Transient reports whether err is one a waiting Acquire rides out: the
// server unreachable, restarting, loading its data, demoted during a
// failover, or a cluster slot moving. A waiter keeps trying (with backoff)
// until its ctx ends, as the Locker contract says Acquire waits. Every other
// error — wrong credentials or permissions, a key of the wrong type, out of
// memory, a script error, the client closed — is returned at once: waiting
// would only hide it.
func Transient(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, goredis.ErrClosed):
		return false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, goredis.ErrPoolTimeout),
		errors.Is(err, net.ErrClosed):
		return true
	case goredis.IsLoadingError(err), goredis.IsReadOnlyError(err), goredis.IsMasterDownError(err),
		goredis.IsClusterDownError(err), goredis.IsTryAgainError(err), goredis.IsNoReplicasError(err),
		goredis.IsMaxClientsError(err):
		return true
	}
	if _, ok := goredis.IsMovedError(err); ok {
		return true
	}
	if _, ok := goredis.IsAskError(err); ok {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}
