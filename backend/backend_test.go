package backend_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
)

func TestParseDSNNeverEchoesPassword(t *testing.T) {
	for _, dsn := range []string{
		"redis://user:s3cret@host:port/0",
		"redis://user:s3cret@[::1/0",
		"redis://user:s3cret@ho st/0",
		"redis://user:s3cret@host/%zz",
		"   ",
	} {
		_, err := backend.ParseDSN(dsn)
		if err == nil {
			t.Errorf("ParseDSN(%q) succeeded", dsn)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseDSN(%q): error leaks the password: %v", dsn, err)
		}
	}
	u, err := backend.ParseDSN("redis://user:s3cret@127.0.0.1:6379/0")
	if err != nil {
		t.Fatal(err)
	}
	if r := backend.Redact(u); strings.Contains(r, "s3cret") {
		t.Errorf("Redact = %q", r)
	}
}

func TestParams(t *testing.T) {
	u, _ := url.Parse("x://h/?prefix=p:&ttl=3s&drift=0.05&n=3&on=true&tll=1s&extra=a&extra=b&bad=1")
	p := backend.NewParams(u)
	if got := p.String("prefix", "dlock:"); got != "p:" {
		t.Errorf("prefix = %q", got)
	}
	if got := p.String("absent", "def"); got != "def" {
		t.Errorf("absent = %q", got)
	}
	if got := p.Duration("ttl", time.Second); got != 3*time.Second {
		t.Errorf("ttl = %v", got)
	}
	if got := p.Float("drift", 0.01, 0, 0.5); got != 0.05 {
		t.Errorf("drift = %v", got)
	}
	if got := p.Int("n", 1, 1, 9); got != 3 {
		t.Errorf("n = %v", got)
	}
	if got := p.Bool("on", false); !got {
		t.Errorf("on = %v", got)
	}
	p.String("extra", "")
	p.Int("bad", 5, 2, 9)
	err := p.Done()
	if err == nil {
		t.Fatal("Done: nil error with an unknown parameter")
	}
	if !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("Done error %q does not match ErrInvalidOption", err)
	}
	// The known names are those the getters were asked for, absent ones
	// included, and the portable ones.
	const known = `known: absent, autorenew, bad, drift, extra, label, n, on, prefix, reentrant, ttl)`
	for _, want := range []string{`"tll"`, known, `"extra" given 2 times`, `bad="1"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Done error %q lacks %q", err, want)
		}
	}
	u2, _ := url.Parse("x://h/?ttl=-1s")
	p2 := backend.NewParams(u2)
	p2.Duration("ttl", time.Second)
	if err := p2.Done(); err == nil || !strings.Contains(err.Error(), "positive duration") || !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("negative duration: %v", err)
	}
	// A query url.Values would read with pairs dropped: the table the
	// user named is not silently replaced by the default.
	u4, _ := url.Parse("x://h/?table=a;b&ttl=2s")
	p4 := backend.NewParams(u4)
	p4.String("table", "def")
	p4.Duration("ttl", time.Second)
	if err := p4.Done(); !errors.Is(err, backend.ErrInvalidOption) || !strings.Contains(err.Error(), "semicolon") {
		t.Errorf("a query with a ';': %v", err)
	}
	u3, _ := url.Parse("x://h/?bogus=1")
	if err := backend.NewParams(u3).Done(); !errors.Is(err, backend.ErrInvalidOption) || !strings.Contains(err.Error(), `unknown DSN parameter "bogus" (known: autorenew, label, reentrant, ttl)`) {
		t.Errorf("a parameter no getter read: %v", err)
	}
}

func TestRegisterPanics(t *testing.T) {
	open := func(context.Context, *url.URL) (backend.Driver, error) { return nil, nil }
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	backend.Register("test-register", open)
	mustPanic("duplicate", func() { backend.Register("test-register", open) })
	mustPanic("nil", func() { backend.Register("test-nil", nil) })
	mustPanic("empty", func() { backend.Register("", open) })
	if _, ok := backend.Lookup("test-register"); !ok {
		t.Error("Lookup after Register failed")
	}
	found := false
	for _, s := range backend.Schemes() {
		found = found || s == "test-register"
	}
	if !found {
		t.Errorf("Schemes() = %v", backend.Schemes())
	}
}

func TestBackoffAndJitter(t *testing.T) {
	b := backend.Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	nominal := []time.Duration{10, 20, 40, 80, 80}
	for i, n := range nominal {
		n *= time.Millisecond
		d := b.Next()
		if d < n/2 || d > n {
			t.Fatalf("wait %d = %v, want in [%v, %v]", i, d, n/2, n)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[backend.Jitter(time.Second)] = true
	}
	if len(seen) < 50 {
		t.Fatalf("Jitter gave only %d distinct values in 100 draws", len(seen))
	}
}

func TestOwnerIDs(t *testing.T) {
	a, b := backend.NewOwnerID(), backend.NewOwnerID()
	if len(a) != 32 || a == b {
		t.Fatalf("owner ids %q, %q", a, b)
	}
}

func TestStrings(t *testing.T) {
	if backend.FencingStrict.String() != "strict" || backend.FencingTimingDependent.String() != "timing-dependent" ||
		backend.FencingNone.String() != "none" || backend.TimeClient.String() != "client" || backend.FencingLevel(9).String() != "FencingLevel(9)" {
		t.Fatal("String methods")
	}
	if d := backend.DriftAllowance(10 * time.Second); d != 102*time.Millisecond {
		t.Fatalf("DriftAllowance(10s) = %v", d)
	}
}

func TestRedactError(t *testing.T) {
	u, _ := url.Parse("redis://user:p%40ss%20w@host/0")
	cause := context.DeadlineExceeded
	err := fmt.Errorf("dial redis://user:p@ss w@host and redis://user:p%%40ss%%20w@host: %w", cause)
	r := backend.RedactError(err, u)
	if strings.Contains(r.Error(), "p@ss w") || strings.Contains(r.Error(), "p%40ss%20w") {
		t.Fatalf("RedactError left the password: %v", r)
	}
	if !errors.Is(r, context.DeadlineExceeded) {
		t.Fatalf("RedactError broke the chain: %v", r)
	}
	clean := errors.New("no secret here")
	if backend.RedactError(clean, u) != clean {
		t.Fatal("RedactError changed an error without the password")
	}
}

func TestSplitHosts(t *testing.T) {
	got, err := backend.SplitHosts("a, b:6380,[::1]:7000,[::1],10.0.0.1", "6379")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a:6379", "b:6380", "[::1]:7000", "[::1]:6379", "10.0.0.1:6379"}
	if !slices.Equal(got, want) {
		t.Errorf("SplitHosts = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "a,,b", "a,", "a:1:2"} {
		if _, err := backend.SplitHosts(bad, "6379"); err == nil {
			t.Errorf("SplitHosts(%q) succeeded", bad)
		}
	}
}

// TestRedactNested: secrets in password query parameters and in DSNs nested in
// query values (migrate://?from=…&to=…) are masked by Redact and RedactError.
func TestRedactNested(t *testing.T) {
	from := "redis://:r3dpw@h1:6379/0"
	to := "etcd://root:etcdpw@h2:2379/locks"
	pg := "postgres://u@h3/db?password=pgpw"
	raw := "migrate://?from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to) + "&x=" + url.QueryEscape(pg)
	u, err := backend.ParseDSN(raw)
	if err != nil {
		t.Fatal(err)
	}
	r := backend.Redact(u)
	for _, pw := range []string{"r3dpw", "etcdpw", "pgpw"} {
		if strings.Contains(r, pw) {
			t.Errorf("Redact(%q) = %q: still holds %q", raw, r, pw)
		}
	}
	if !strings.Contains(r, "h1") || !strings.Contains(r, "h2") {
		t.Errorf("Redact(%q) = %q: lost the hosts", raw, r)
	}
	err = fmt.Errorf("open %s (inner %s, %s): %w", raw, from, pg, context.Canceled)
	re := backend.RedactError(err, u)
	for _, pw := range []string{"r3dpw", "etcdpw", "pgpw"} {
		if strings.Contains(re.Error(), pw) {
			t.Errorf("RedactError left %q: %v", pw, re)
		}
	}
	if !errors.Is(re, context.Canceled) {
		t.Errorf("RedactError broke the chain: %v", re)
	}
}

// TestRedactMalformedNested: a nested DSN that does not parse is hidden whole,
// and its password is still scrubbed from errors.
func TestRedactMalformedNested(t *testing.T) {
	inner := "redis://:s3cr3t@h:xx/0" // bad port
	u, err := backend.ParseDSN("migrate://?from=" + url.QueryEscape(inner) + "&to=etcd://h2")
	if err != nil {
		t.Fatal(err)
	}
	if r := backend.Redact(u); strings.Contains(r, "s3cr3t") {
		t.Errorf("Redact = %q: holds the password", r)
	}
	e := backend.RedactError(fmt.Errorf("open %s: %w", inner, context.Canceled), u)
	if strings.Contains(e.Error(), "s3cr3t") {
		t.Errorf("RedactError = %v: holds the password", e)
	}
}

func TestRedactKeepsEmptyAuthority(t *testing.T) {
	u, err := url.Parse("migrate://?from=redis%3A%2F%2Fapp%3As3cret%40h%3A6379&to=etcd%3A%2F%2Fh%3A2379")
	if err != nil {
		t.Fatal(err)
	}
	got := backend.Redact(u)
	if !strings.HasPrefix(got, "migrate://?") || strings.Contains(got, "s3cret") {
		t.Errorf("Redact = %q, want migrate://?… with the password masked", got)
	}
}

// TestRedactErrorShortPassword: a short password is masked where it stands
// as a secret (the DSN's user info, a quoted value, a query parameter, an
// escaped nested DSN), and never inside another word of the message.
func TestRedactErrorShortPassword(t *testing.T) {
	u, err := backend.ParseDSN("etcd://root:tc@h1:2379/locks?x=" + url.QueryEscape("redis://:tc@h2/0"))
	if err != nil {
		t.Fatal(err)
	}
	err = fmt.Errorf("etcd at etcd://root:tc@h1:2379 (redis%%3A%%2F%%2F%%3Atc%%40h2): password \"tc\", password=tc: etcdserver: tcp dial: %w", context.Canceled)
	got := backend.RedactError(err, u).Error()
	want := "etcd at etcd://root:xxxxx@h1:2379 (redis%3A%2F%2F%3Axxxxx%40h2): password \"xxxxx\", password=xxxxx: etcdserver: tcp dial: context canceled"
	if got != want {
		t.Fatalf("RedactError =\n  %s\nwant\n  %s", got, want)
	}
	// A password whose ends are not letters or digits is masked wherever it is.
	u, _ = url.Parse("redis://:%2Fx%21@h/0") // "/x!"
	if got := backend.RedactError(errors.New("a/x!b"), u).Error(); got != "axxxxxb" {
		t.Fatalf("RedactError = %q, want axxxxxb", got)
	}
}
