package rediscore

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
)

// TestSubscribeDuringCutIsConfirmedAfterHeal: a waiter that subscribes while
// the pub/sub connection is cut is confirmed soon after the connection comes
// back, not only after the reader's idle health interval (30 s): the mux
// keeps pinging while a subscription is unconfirmed. And a release published
// after the confirmation reaches the waiter.
func TestSubscribeDuringCutIsConfirmedAfterHeal(t *testing.T) {
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	client := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	errClosed := errors.New("mux closed")
	m := NewMux(client, errClosed)
	t.Cleanup(m.Close)

	// A first subscription opens the pub/sub connection and is confirmed.
	wake0, ready0 := make(chan struct{}, 1), make(chan struct{}, 1)
	w0, err := m.Subscribe("first", wake0, ready0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unsubscribe(w0, false)
	select {
	case <-ready0:
	case <-time.After(10 * time.Second):
		t.Fatal("first subscription not confirmed within 10s on a healthy connection")
	}

	proxy.Cut(t)
	wake, ready := make(chan struct{}, 1), make(chan struct{}, 1)
	w, err := m.Subscribe("second", wake, ready)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unsubscribe(w, false)
	select {
	case <-ready:
		t.Fatal("subscription confirmed while the connection is cut")
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Heal(t)
	healed := time.Now()
	const bound = 10 * time.Second // well under healthInterval (30 s)
	select {
	case <-ready:
		t.Logf("confirmed %v after the heal", time.Since(healed).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("subscription made during a cut not confirmed within %v of the heal (the reader's idle ping comes after %v)", bound, healthInterval)
	}
	// Drain the wake-up the reconnect gives every waiter, then publish.
	select {
	case <-wake:
	default:
	}
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := direct.Publish(ctx, "second", "").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatal("a release published after the confirmation did not wake the waiter")
	}
}
