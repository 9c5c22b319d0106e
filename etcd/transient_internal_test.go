package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTransient: timeouts and unavailable members are retried, including the
// Unknown-coded "context deadline exceeded" a member answers a keep-alive
// with during a leader election; other failures are not.
func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("renew: %w", context.DeadlineExceeded), true},
		{status.Error(codes.Unavailable, "etcdserver: no leader"), true},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true},
		{status.Error(codes.Unknown, context.DeadlineExceeded.Error()), true},
		{status.Error(codes.Unknown, "something else"), false},
		{status.Error(codes.PermissionDenied, "etcdserver: permission denied"), false},
		{errors.New("boom"), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
