package redlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redlock"
)

func TestDSN(t *testing.T) {
	c := startCluster(t, 3)
	ctx := testCtx(t)
	const password = "right-password"
	// Not --requirepass: testenv's readiness probe does not authenticate.
	for _, a := range c.admin {
		if err := a.ConfigSet(ctx, "requirepass", password).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hosts := strings.Join(c.addrs(), ",")
	free := func() string { return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) }
	const secret = "s3cret"

	cases := []struct {
		name, dsn string
		want      []string // substrings of the error
	}{
		{"unknown parameters", "redlock://:" + secret + "@" + hosts + "?bogus=1&zz=2", []string{`bogus`, `zz`}},
		{"bad go-redis parameter", "redlock://u:" + secret + "@" + hosts + "?dial_timeout=soon", []string{"dial_timeout"}},
		{"unknown go-redis parameter", "redlock://u:" + secret + "@" + hosts + "?dial_timeuot=1s", []string{"dial_timeuot", "node_timeout"}},
		{"drift too large", "redlock://u:" + secret + "@" + hosts + "?drift=0.9", []string{"drift"}},
		{"drift not a number", "redlock://u:" + secret + "@" + hosts + "?drift=high", []string{"drift"}},
		{"bad node_timeout", "redlock://u:" + secret + "@" + hosts + "?node_timeout=-1s", []string{"node_timeout"}},
		{"bad retry_delay", "redlock://u:" + secret + "@" + hosts + "?retry_delay=soon", []string{"retry_delay"}},
		{"repeated poll", "redlock://u:" + secret + "@" + hosts + "?poll=1s&poll=2s", []string{"poll"}},
		{"brace in prefix", "redlock://u:" + secret + "@" + hosts + "?prefix=a{b}:", []string{"prefix"}},
		{"empty prefix", "redlock://u:" + secret + "@" + hosts + "?prefix=", []string{"prefix"}},
		{"bad db", "redlock://u:" + secret + "@" + hosts + "/zero", []string{"database"}},
		{"empty host", "redlock://u:" + secret + "@" + c.nodes[0].Addr() + ",," + c.nodes[1].Addr(), []string{"empty host"}},
		{"no hosts", "redlock://u:" + secret + "@/0", []string{"no nodes"}},
		{"bad host", "redlock://u:" + secret + "@" + c.nodes[0].Addr() + ",127.0.0.1:1:2", []string{"127.0.0.1:1:2"}},
		{"wrong password", "redlock://:" + secret + "@" + hosts, []string{"WRONGPASS", c.nodes[0].Addr(), "no quorum"}},
		{"wrong user and password", "redlock://bob:" + secret + "@" + hosts, []string{"WRONGPASS"}},
		{"escaped password", "redlock://:" + secret + "%2F%40x@" + hosts + "?bogus=1", []string{"bogus"}},
		{"nothing listening", "redlock://:" + secret + "@" + free() + "," + free() + "," + free(), []string{"refused", "no quorum"}},
		{"TLS to plain servers", "redlocks://:" + secret + "@" + hosts + "?dial_timeout=1s", []string{c.nodes[1].Addr(), "no quorum"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := dlock.Open(octx, tc.dsn)
			if err == nil {
				_ = l.Close()
				t.Fatalf("Open(%q) succeeded", tc.dsn)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if strings.Contains(msg, secret) {
				t.Errorf("error contains the password: %s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}

	// Parameter errors match ErrInvalidOption.
	if _, err := dlock.Open(ctx, "redlock://"+hosts+"?bogus=1"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("unknown parameter: %v, want it to match ErrInvalidOption", err)
	}

	// Open is bounded by ctx: paused servers never answer.
	p1, p2 := testenv.StartRedis(t), testenv.StartRedis(t)
	p1.Pause()
	p2.Pause()
	defer p1.Resume()
	defer p2.Resume()
	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if l, err := dlock.Open(octx, "redlock://"+p1.Addr()+","+p2.Addr()+","+c.nodes[0].Addr()); err == nil {
		_ = l.Close()
		t.Fatal("Open with 2 of 3 nodes paused succeeded")
	} else if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Open with a 300ms ctx returned after %v: %v", d, err)
	}

	// The right password, and every driver parameter, work.
	l, err := dlock.Open(ctx, "redlock://:"+password+"@"+hosts+"/3?prefix=app:&poll=250ms&drift=0.02&node_timeout=50ms&retry_delay=5ms&dial_timeout=2s&ttl=5s")
	if err != nil {
		t.Fatalf("Open with valid parameters: %v", err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "dsn")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		raw := goredis.NewClient(&goredis.Options{Addr: n.Addr(), Password: password, DB: 3})
		if got, err := raw.Get(ctx, "app:{dsn}").Result(); err != nil || got == "" {
			t.Errorf("node %s: lock key app:{dsn} in db 3: %q, %v", n.Addr(), got, err)
		}
		if ttl, err := raw.PTTL(ctx, "app:{dsn}").Result(); err != nil || ttl > 5*time.Second || ttl < 4*time.Second {
			t.Errorf("node %s: PTTL of the lock = %v (err %v), want the DSN's ttl=5s", n.Addr(), ttl, err)
		}
		// Change the password behind the locker's back and drop its
		// connections: every later request fails to authenticate.
		if err := raw.ConfigSet(ctx, "requirepass", "other-"+secret).Err(); err != nil {
			t.Fatal(err)
		}
		_ = raw.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err()
		_ = raw.Close()
	}
	err = lease.Release(ctx)
	t.Logf("release after the password changed: %v", err)
	if err == nil || strings.Contains(err.Error(), password) || strings.Contains(err.Error(), secret) {
		t.Errorf("release after the password changed: %v; want an error without a password", err)
	}
	_, err = l.TryAcquire(ctx, "dsn2")
	t.Logf("acquire after the password changed: %v", err)
	if !errors.Is(err, redlock.ErrNoQuorum) || strings.Contains(err.Error(), password) || strings.Contains(err.Error(), secret) {
		t.Errorf("acquire after the password changed: %v; want ErrNoQuorum without a password", err)
	}
}
