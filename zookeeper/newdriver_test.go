package zookeeper_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/zookeeper"
)

// TestNewDriverWaitsForSession: NewDriver returns once its connection has a
// session, as Dial does, and fails when ctx ends first: over a connection
// to an address nobody answers at, it fails with ctx's error.
func TestNewDriverWaitsForSession(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	conn, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	d, err := zookeeper.NewDriver(ctx, conn, &zookeeper.Options{SessionTimeout: 4 * time.Second})
	if err == nil {
		_ = d.Close()
		t.Fatal("NewDriver over a connection without a session succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("NewDriver over a connection without a session: %v, want context.DeadlineExceeded", err)
	}
}
