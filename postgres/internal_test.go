package postgres

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPoolingVerdict(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pinned   []uint32
		stranger uint32
		want     string // "" for no error
	}{
		{"session pooling", []uint32{100, 100, 100}, 200, ""},
		{"busy transaction pool moves the client", []uint32{100, 101, 100}, 200, "changed from 100 to 101"},
		{"moved on the last transaction", []uint32{100, 100, 102}, 200, "changed from 100 to 102"},
		{"quiet transaction pool shares the session", []uint32{100, 100, 100}, 100, "same server session 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := poolingVerdict(tc.pinned, tc.stranger)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verdict: %v, want none", err)
				}
				return
			}
			if !errors.Is(err, ErrTransactionPooling) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verdict: %v, want ErrTransactionPooling saying %q", err, tc.want)
			}
		})
	}
}

func TestLeaseTimeout(t *testing.T) {
	for _, tc := range []struct {
		ttl      time.Duration
		ms       int64
		validity time.Duration
	}{
		{time.Second, 1000, time.Second - 12*time.Millisecond},
		{1500 * time.Microsecond * 1000, 1500, 1500*time.Millisecond - 17*time.Millisecond},
		{time.Second + time.Microsecond, 1001, time.Second + time.Microsecond - (10*time.Millisecond + 10 + 2*time.Millisecond)},
		{100 * 24 * time.Hour, math.MaxInt32, time.Duration(math.MaxInt32)*time.Millisecond - (24*time.Hour + 2*time.Millisecond)},
	} {
		ms, v, err := leaseTimeout(tc.ttl)
		if err != nil || ms != tc.ms || v != tc.validity {
			t.Errorf("leaseTimeout(%v) = %d ms, %v, %v; want %d ms, %v", tc.ttl, ms, v, err, tc.ms, tc.validity)
		}
		// The server never ends the session before the validity runs out.
		if time.Duration(ms)*time.Millisecond < v {
			t.Errorf("leaseTimeout(%v): idle timeout %d ms is shorter than the validity %v", tc.ttl, ms, v)
		}
	}
	if _, _, err := leaseTimeout(2 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Errorf("leaseTimeout(2ms): %v, want too short", err)
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []Options{
		{Namespace: "a\x00b"},
		{Namespace: "bad\xff"},
		{Table: "a.b.c"},
		{Table: "a."},
		{Table: ".b"},
	} {
		if _, err := o.withDefaults(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o, err := (*Options)(nil).withDefaults()
	if err != nil || o.Namespace != DefaultNamespace || o.Table != DefaultTable {
		t.Fatalf("nil options: %+v, %v", o, err)
	}
	id, _ := tableIdent(`my schema.dlock "fence"`)
	if got := id.Sanitize(); got != `"my schema"."dlock ""fence"""` {
		t.Fatalf("quoted table = %s", got)
	}
}

func TestAdvisoryKey(t *testing.T) {
	h := HashKey("dlock", "jobs/nightly")
	if h == HashKey("dlock", "jobs/nightly2") || h == HashKey("dlock2", "jobs/nightly") || h != HashKey("dlock", "jobs/nightly") {
		t.Fatal("HashKey is not a function of (namespace, key)")
	}
	// The separator keeps (ns, key) pairs apart that plain concatenation would merge.
	if HashKey("ab", "c") == HashKey("a", "bc") {
		t.Fatal("HashKey(ab, c) == HashKey(a, bc)")
	}
	k := Options{}.AdvisoryKey("jobs/nightly")
	if k.Int4Pair || k.Int8 != h {
		t.Fatalf("default AdvisoryKey = %+v", k)
	}
	c, o, s := k.PgLocks()
	if uint64(c)<<32|uint64(o) != uint64(h) || s != 1 {
		t.Fatalf("PgLocks() = %d, %d, %d for %d", c, o, s, h)
	}
	p := Options{Int4Pair: true, ClassID: -5}.AdvisoryKey("jobs/nightly")
	if !p.Int4Pair || p.Key1 != -5 || p.Key2 != int32(h>>32) {
		t.Fatalf("pair AdvisoryKey = %+v", p)
	}
	if c, o, s := p.PgLocks(); c != uint32(0xfffffffb) || o != uint32(p.Key2) || s != 2 {
		t.Fatalf("pair PgLocks() = %d, %d, %d", c, o, s)
	}
}
