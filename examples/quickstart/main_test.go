package main

import "testing"

// The quickstart's own invariants (a stale write rejected, no deposit lost)
// are checked by run; this runs it as `go run ./examples/quickstart` would, with
// a short TTL.
func TestQuickstart(t *testing.T) {
	if err := run("mem://quickstart-test", 300e6); err != nil {
		t.Fatal(err)
	}
}
