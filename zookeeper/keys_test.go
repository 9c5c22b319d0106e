package zookeeper_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestEscapeKey(t *testing.T) {
	for key, want := range map[string]string{
		"jobs/nightly": "jobs%2Fnightly",
		"a%2Fb":        "a%252Fb",
		"%":            "%25",
		".":            "%2E",
		"..":           "%2E%2E",
		"...":          "...",
		"./..":         ".%2F..",
		"a b\tc\n":     "a b%09c%0A",
		"ключ":         "ключ",
		"🔒":            "%F0%9F%94%92",
		"\u0085":       "%C2%85",
		"\ue000\uf8ff": "%EE%80%80%EF%A3%BF",
		"\ufff0\uffff": "%EF%BF%B0%EF%BF%BF",
		"\ufffd":       "%EF%BF%BD",
		"bad\xff":      "bad%FF",
		"zookeeper":    "zookeeper",
		"_c_-lock-1":   "_c_-lock-1",
	} {
		if got := zookeeper.EscapeKey(key); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestEscapeKeyInjective checks that keys a naive scheme would merge stay
// apart, and that every name is a valid ZooKeeper node name.
func TestEscapeKeyInjective(t *testing.T) {
	keys := []string{
		"a/b", "a%2Fb", "a%252Fb", "a%2fb", "a/", "/a", "a", ".", "..", "%2E", "%2E%2E",
		"a\x00", "a\x01", "🔒", "%F0%9F%94%92", "\ufffd", "\xff", "%FF", " ", "\t", "%09",
	}
	seen := map[string]string{}
	for _, k := range keys {
		name := zookeeper.EscapeKey(k)
		if other, dup := seen[name]; dup {
			t.Errorf("keys %q and %q both map to %q", k, other, name)
		}
		seen[name] = k
		if name == "" || name == "." || name == ".." || strings.Contains(name, "/") || !utf8.ValidString(name) {
			t.Errorf("EscapeKey(%q) = %q: not a valid node name", k, name)
		}
		for _, r := range name {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				t.Errorf("EscapeKey(%q) = %q keeps %U, which ZooKeeper forbids", k, name, r)
			}
		}
	}
}

func TestSortedLocks(t *testing.T) {
	got := zookeeper.SortedLocks([]string{
		"_c_8f1e0c7a-0000-4000-8000-000000000000-lock-0000000012",
		"readme",
		"_c_0123456789abcdef0123456789abcdef-lock-0000000003", // go-zookeeper's zk.Lock
		"lock-0000000007", // Curator without protection
	}, 20)
	want := []string{
		"_c_0123456789abcdef0123456789abcdef-lock-0000000003",
		"lock-0000000007",
		"_c_8f1e0c7a-0000-4000-8000-000000000000-lock-0000000012",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("SortedLocks = %q, want %q", got, want)
	}
}

// Shared nodes sort among the others by their sequence, and only dlock's own
// reader nodes count as shared: every foreign node excludes them.
func TestHolders(t *testing.T) {
	const (
		r1 = "_c_8f1e0c7a-0000-4000-8000-000000000001-read-lock-0000000001"
		r2 = "_c_8f1e0c7a-0000-4000-8000-000000000002-read-lock-0000000002"
		x3 = "_c_8f1e0c7a-0000-4000-8000-000000000003-lock-0000000003"
		r4 = "_c_8f1e0c7a-0000-4000-8000-000000000004-read-lock-0000000004"
		zl = "_c_0123456789abcdef0123456789abcdef-lock-0000000005" // go-zookeeper's zk.Lock
		cu = "read-lock-0000000006"                                // not protected: not dlock's
	)
	if got := zookeeper.SortedLocks([]string{r4, x3, r2, r1}, 10); !slices.Equal(got, []string{r1, r2, x3, r4}) {
		t.Errorf("SortedLocks with reader nodes = %q", got)
	}
	for _, tc := range []struct {
		locks []string
		want  int
	}{
		{nil, 0},
		{[]string{r1}, 1},
		{[]string{r1, r2, x3, r4}, 2},
		{[]string{x3, r4}, 1},
		{[]string{zl, r4}, 1},
		{[]string{cu, r4}, 1},
		{[]string{r1, zl, r4}, 1},
		{[]string{r1, cu}, 1},
	} {
		if got := zookeeper.Holders(tc.locks); got != tc.want {
			t.Errorf("Holders(%q) = %d, want %d", tc.locks, got, tc.want)
		}
	}
}

// After 2^31 creates and deletes under a key node that never empties, the
// parent's cversion (the sequence source) wraps to -2147483648. Nodes made on
// both sides of the wrap must still be ordered by arrival: text order puts
// every "-" first (and among negatives the newest first), numeric order puts
// the new negatives before the old holder.
func TestSortedLocksAcrossSequenceWrap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cversion int32
		arrival  []string // oldest first
	}{
		{"holder just before the wrap, waiters after", -2147483645, []string{
			"_c_a-lock-2147483646", "_c_b-lock-2147483647", "_c_c-lock--2147483648", "_c_d-lock--2147483647"}},
		// Negative suffixes as Java's "%010d" prints them.
		{"all after the wrap", -1000, []string{
			"_c_a-lock--2147483648", "_c_b-lock--2147483647", "_c_c-lock--000002000"}},
		{"holder made long ago, before the wrap", -1000, []string{
			"_c_a-lock-0000000005", "_c_b-lock-1500000000", "_c_c-lock--000002000"}},
		{"the second crossing, from -1 to 0", 3, []string{
			"_c_a-lock--000000002", "_c_b-lock--000000001", "_c_c-lock-0000000000", "_c_d-lock-0000000001"}},
		{"a suffix that is not a number sorts first", 10, []string{
			"_c_x-lock-abc", "_c_a-lock-0000000002", "_c_b-lock-0000000005"}},
	} {
		shuffled := slices.Clone(tc.arrival)
		slices.Reverse(shuffled)
		if got := zookeeper.SortedLocks(shuffled, tc.cversion); !slices.Equal(got, tc.arrival) {
			t.Errorf("%s: SortedLocks = %q, want arrival order %q", tc.name, got, tc.arrival)
		}
	}
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		opts *zookeeper.Options
		want string
	}{
		{&zookeeper.Options{Root: "dlock"}, "absolute"},
		{&zookeeper.Options{Root: "/"}, "root of the tree"},
		{&zookeeper.Options{Root: "/zookeeper/locks"}, "/zookeeper"},
		{&zookeeper.Options{Root: "/a/../b"}, "relative"},
		{&zookeeper.Options{Root: "/a\x01"}, "not allowed"},
		{&zookeeper.Options{SessionTimeout: -1}, "session timeout"},
		{&zookeeper.Options{Digest: "alice"}, "user:password"},
	} {
		_, err := zookeeper.Dial(ctx, []string{"127.0.0.1:1"}, tc.opts)
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial with %+v: %v; want ErrInvalidOption mentioning %q", *tc.opts, err, tc.want)
		}
	}
	if _, err := zookeeper.Dial(ctx, nil, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Dial with no server: %v", err)
	}
	if _, err := zookeeper.NewDriver(ctx, nil, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("NewDriver(nil): %v", err)
	}
}

// A lease node's data round-trips its slot and n; a waiter's has no slot;
// data that is not dlock's (Curator's address) does not parse.
func TestPermitData(t *testing.T) {
	for _, tc := range []struct {
		slot, n int
		label   string
		want    string
	}{
		{0, 4, "host:12", "slot=0 permits=4 host:12"},
		{1023, 1024, "", "slot=1023 permits=1024"},
		{-1, 2, "a b", "permits=2 a b"},
	} {
		data := zookeeper.PermitData(tc.slot, tc.n, tc.label)
		if string(data) != tc.want {
			t.Errorf("PermitData(%d, %d, %q) = %q, want %q", tc.slot, tc.n, tc.label, data, tc.want)
		}
		slot, n, ok := zookeeper.ParsePermitData(data)
		if !ok || slot != tc.slot || n != tc.n {
			t.Errorf("ParsePermitData(%q) = %d, %d, %v", data, slot, n, ok)
		}
	}
	for _, foreign := range []string{"", "127.0.0.1", "10.0.0.7", "slot=1", "slot=x permits=2", "slot=-1 permits=2", "permits=0", "permits=2x", "slot=1 host"} {
		if slot, n, ok := zookeeper.ParsePermitData([]byte(foreign)); ok {
			t.Errorf("ParsePermitData(%q) = %d, %d, true; want not dlock's", foreign, slot, n)
		}
	}
}
