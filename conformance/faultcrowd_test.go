package conformance

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/semaphore"
)

// crowdFailures on a semaphore of 3: a clean trial passes; a permit on a
// fourth slot, two contenders on one slot at once, and the holder's slot
// granted before the fault each fail it, saying so.
func TestCrowdFailuresSemaphore(t *testing.T) {
	const k, faultAt = "sem", int64(50)
	slot := func(i int) string { return semaphore.SlotKey(k, i) }
	holder := tenure{label: "holder", key: slot(0), token: 10, granted: 1, until: 100}
	clean := []tenure{
		{label: "c1", key: slot(1), token: 11, called: 2, granted: 10, until: 200},
		{label: "c2", key: slot(2), token: 12, called: 2, granted: 11, until: 201},
		{label: "c3", key: slot(0), token: 13, called: 2, granted: 110, until: 202},
	}
	if f := crowdFailures(k, rolePermits, holder, clean, faultAt); len(f) != 0 {
		t.Fatalf("a clean trial: %q", f)
	}
	for _, tc := range []struct {
		name  string
		extra tenure
		want  []string
	}{
		{"a fourth slot", tenure{label: "c4", key: slot(3), token: 14, called: 2, granted: 12, until: 203},
			[]string{`c4's permit is "sem/permits/3", not one of the 3 slots`, "4 held permits of \"sem\" at once before the fault", "4 contenders held permits"}},
		{"one slot twice", tenure{label: "c4", key: slot(1), token: 14, called: 2, granted: 150, until: 203},
			[]string{"c1 (token 11, granted", "held \"sem/permits/1\" at once", "4 contenders held permits"}},
		{"the holder's slot before the fault", tenure{label: "c4", key: slot(0), token: 14, called: 2, granted: 20, until: 30},
			[]string{"c4 was granted \"sem/permits/0\" (token 14)", "before the fault", "4 held permits of \"sem\" at once before the fault"}},
	} {
		ts := append(append([]tenure(nil), clean...), tc.extra)
		got := strings.Join(crowdFailures(k, rolePermits, holder, sortedTenures(ts), faultAt), "\n")
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: failures %q lack %q", tc.name, got, w)
			}
		}
	}
}

// crowdFailures on a read/write lock: the later reader granted while the
// writer holds fails the trial, and so does a later reader whose token is
// not above the writer's; readers beside readers do not.
func TestCrowdFailuresReader(t *testing.T) {
	const k, faultAt = "rw", int64(50)
	holder := tenure{label: "holder", key: k, read: true, token: 10, granted: 1, until: 100}
	writer := tenure{label: "writer", key: k, token: 11, called: 2, granted: 110, until: 200}
	for _, tc := range []struct {
		name   string
		reader tenure
		want   string
	}{
		{"after the writer", tenure{label: "reader", key: k, read: true, token: 12, called: 120, granted: 201, until: 202}, ""},
		{"beside the writer", tenure{label: "reader", key: k, read: true, token: 12, called: 120, granted: 150, until: 202}, "writer (token 11, granted"},
		{"a token not above the writer's", tenure{label: "reader", key: k, read: true, token: 11, called: 120, granted: 201, until: 202}, "has token 11, not above its 11"},
		{"beside the holder, before the fault", tenure{label: "reader", key: k, read: true, token: 10, called: 3, granted: 4, until: 5}, ""},
	} {
		got := strings.Join(crowdFailures(k, roleReader, holder, sortedTenures([]tenure{writer, tc.reader}), faultAt), "\n")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: failures %q, want %q", tc.name, got, tc.want)
		}
	}
}

func sortedTenures(ts []tenure) []tenure {
	out := slices.Clone(ts)
	slices.SortFunc(out, func(a, b tenure) int { return cmp.Compare(a.granted, b.granted) })
	return out
}
