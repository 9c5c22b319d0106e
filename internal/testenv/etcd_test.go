package testenv

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// etcdPut writes key=value through the JSON gateway of endpoint.
func etcdPut(ctx context.Context, endpoint, key, value string) error {
	body, _ := json.Marshal(map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte(key)),
		"value": base64.StdEncoding.EncodeToString([]byte(value)),
	})
	_, err := etcdHTTP(ctx, http.MethodPost, endpoint, "/v3/kv/put", body)
	return err
}

// etcdGet reads key through the JSON gateway of endpoint; "" if absent.
func etcdGet(ctx context.Context, endpoint, key string) (string, error) {
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))})
	b, err := etcdHTTP(ctx, http.MethodPost, endpoint, "/v3/kv/range", body)
	if err != nil {
		return "", err
	}
	var r struct {
		Kvs []struct {
			Value string `json:"value"`
		} `json:"kvs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", err
	}
	if len(r.Kvs) == 0 {
		return "", nil
	}
	v, err := base64.StdEncoding.DecodeString(r.Kvs[0].Value)
	return string(v), err
}

func mustEtcdPut(t *testing.T, endpoint, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := etcdPut(ctx, endpoint, key, value); err != nil {
		t.Fatalf("put %s=%s on %s: %v", key, value, endpoint, err)
	}
}

func mustEtcdGet(t *testing.T, endpoint, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := etcdGet(ctx, endpoint, key)
	if err != nil || got != want {
		t.Fatalf("get %s on %s = %q, %v; want %q", key, endpoint, got, err, want)
	}
}

func TestEtcdLifecycle(t *testing.T) {
	e := StartEtcd(t)
	if !strings.HasPrefix(e.Endpoint(), "127.0.0.1:") || e.URL() != "etcd://"+e.Endpoint() {
		t.Fatalf("Endpoint() = %q, URL() = %q", e.Endpoint(), e.URL())
	}
	if !e.Alive() || e.PID() <= 0 || e.Name() != "n0" {
		t.Fatalf("Alive() = %v, PID() = %d, Name() = %q after start", e.Alive(), e.PID(), e.Name())
	}
	if err := listenerOwnedBy(e.PID(), e.ClientPort()); err != nil {
		t.Fatal(err)
	}
	mustEtcdPut(t, e.Endpoint(), "k", "v")
	mustEtcdGet(t, e.Endpoint(), "k", "v")

	// Paused: connections are accepted, nothing answers.
	e.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := etcdGet(ctx, e.Endpoint(), "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while paused: %v, want a timeout", err)
	}
	e.Resume()
	mustEtcdGet(t, e.Endpoint(), "k", "v")

	// Killed: refused. Restarted: same port, new process, data kept.
	oldPID := e.PID()
	e.Kill()
	if e.Alive() {
		t.Fatal("Alive() after Kill")
	}
	if _, err := etcdGet(context.Background(), e.Endpoint(), "k"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("get after Kill: %v, want connection refused", err)
	}
	e.Restart()
	if e.PID() == oldPID || !e.Alive() {
		t.Fatalf("after Restart PID = %d (was %d), Alive() = %v", e.PID(), oldPID, e.Alive())
	}
	mustEtcdGet(t, e.Endpoint(), "k", "v")

	e.Stop()
	if e.Alive() {
		t.Fatal("Alive() after Stop")
	}
}

func TestEtcdCluster(t *testing.T) {
	c := StartEtcdCluster(t, 3)
	if len(c.Members) != 3 || len(c.Endpoints()) != 3 {
		t.Fatalf("%d members, %d endpoints", len(c.Members), len(c.Endpoints()))
	}
	if want := "etcd://" + strings.Join(c.Endpoints(), ","); c.URL() != want {
		t.Fatalf("URL() = %q, want %q", c.URL(), want)
	}
	leader := c.Leader(t)
	mustEtcdPut(t, leader.Endpoint(), "k", "before")

	// Kill the leader: the other two elect a new one and serve writes.
	leader.Kill()
	next := c.Leader(t)
	if next == leader {
		t.Fatal("the killed member is still reported as the leader")
	}
	mustEtcdPut(t, next.Endpoint(), "k", "after")

	// The old leader rejoins with its data and catches up.
	leader.Restart()
	for _, m := range c.Members {
		mustEtcdGet(t, m.Endpoint(), "k", "after")
	}

	// A paused member holds up nothing: the others still serve writes.
	follower := c.Members[0]
	if follower == c.Leader(t) {
		follower = c.Members[1]
	}
	follower.Pause()
	for _, m := range c.Members {
		if m != follower {
			mustEtcdPut(t, m.Endpoint(), "k2", fmt.Sprint("via ", m.Name()))
		}
	}
	follower.Resume()
}
