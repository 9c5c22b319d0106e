package etcd

import (
	"net/url"
	"slices"
	"testing"
	"time"
)

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn       string
		endpoints []string
		prefix    string // after Options.withDefaults
		user, pw  string
		tls       bool
		dial, req time.Duration
	}{
		{dsn: "etcd://127.0.0.1:2379", endpoints: []string{"127.0.0.1:2379"}, prefix: DefaultPrefix},
		{dsn: "etcd://a,b,c/locks/", endpoints: []string{"a:2379", "b:2379", "c:2379"}, prefix: "/locks"},
		{dsn: "etcd://a,b:2380,c:2381", endpoints: []string{"a:2379", "b:2380", "c:2381"}, prefix: DefaultPrefix},
		{dsn: "etcd://[::1]/x", endpoints: []string{"[::1]:2379"}, prefix: "/x"},
		{dsn: "etcd://h/a%2Fb/c", endpoints: []string{"h:2379"}, prefix: "/a/b/c"},
		{dsn: "etcd://h/", endpoints: []string{"h:2379"}, prefix: DefaultPrefix},
		{dsn: "etcd://bob:s%40cret@h:1/p", endpoints: []string{"h:1"}, prefix: "/p", user: "bob", pw: "s@cret"},
		{dsn: "etcds://h:1/p?dial-timeout=1s&request-timeout=2s", endpoints: []string{"h:1"}, prefix: "/p", tls: true,
			dial: time.Second, req: 2 * time.Second},
	} {
		u, err := url.Parse(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg, o, err := parseDSN(u)
		if err != nil {
			t.Errorf("parseDSN(%q): %v", tc.dsn, err)
			continue
		}
		o, err = o.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if tc.dial == 0 {
			tc.dial, tc.req = DefaultDialTimeout, DefaultRequestTimeout
		}
		if !slices.Equal(cfg.Endpoints, tc.endpoints) || o.Prefix != tc.prefix || cfg.Username != tc.user ||
			cfg.Password != tc.pw || (cfg.TLS != nil) != tc.tls || cfg.DialTimeout != tc.dial || o.RequestTimeout != tc.req {
			t.Errorf("parseDSN(%q) = endpoints %q, prefix %q, user %q, password %q, TLS %v, dial %v, request %v",
				tc.dsn, cfg.Endpoints, o.Prefix, cfg.Username, cfg.Password, cfg.TLS != nil, cfg.DialTimeout, o.RequestTimeout)
		}
	}
}

func TestTTLSeconds(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int64
	}{
		{time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {1500 * time.Millisecond, 2}, {10 * time.Second, 10},
	} {
		if got, err := ttlSeconds(tc.ttl); err != nil || got != tc.want {
			t.Errorf("ttlSeconds(%v) = %d, %v; want %d", tc.ttl, got, err, tc.want)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := ttlSeconds(ttl); err == nil {
			t.Errorf("ttlSeconds(%v): no error", ttl)
		}
	}
}

func TestVersionBefore(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"3.4.23", true}, {"3.5.0", false}, {"3.6.16", false}, {"4.0.0", false}, {"2.3.8", true}, {"", true}, {"x.y", true},
	} {
		if got := versionBefore(tc.v, 3, 5); got != tc.want {
			t.Errorf("versionBefore(%q, 3, 5) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
