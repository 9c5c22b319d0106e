package fencing_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/memlock" // registers mem://
)

func TestGuardRejectsOlderTokens(t *testing.T) {
	var g fencing.Guard
	wrote := 0
	write := func() error { wrote++; return nil }
	steps := []struct {
		token dlock.Token
		ok    bool
	}{{33, true}, {33, true}, {34, true}, {33, false}, {0, false}, {35, true}, {34, false}}
	for i, s := range steps {
		err := g.Do("file", s.token, write)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: Do with token %d: err=%v, want ok=%v", i, s.token, err, s.ok)
		}
		if err != nil {
			var se *fencing.StaleTokenError
			if !errors.Is(err, fencing.ErrStaleToken) || !errors.As(err, &se) || se.Token != s.token {
				t.Fatalf("step %d: %v is not a StaleTokenError for token %d", i, err, s.token)
			}
		}
	}
	if wrote != 4 {
		t.Fatalf("%d writes ran, want 4", wrote)
	}
	if got := g.Highest("file"); got != 35 {
		t.Fatalf("Highest = %d, want 35", got)
	}
	if got := g.Highest("other"); got != 0 {
		t.Fatalf("Highest of an unseen resource = %d", got)
	}
	// Resources are independent.
	if err := g.Do("other", 1, nil); err != nil {
		t.Fatal(err)
	}
}

func TestGuardAdvanceRejectsEqual(t *testing.T) {
	var g fencing.Guard
	if err := g.Advance("r", 5, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.Advance("r", 5, nil); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("Advance with an equal token: %v", err)
	}
	if err := g.Advance("r", 6, nil); err != nil {
		t.Fatal(err)
	}
}

// A failed write still fences older holders off.
func TestGuardRecordsTokenOnFailedWrite(t *testing.T) {
	var g fencing.Guard
	g.Do("r", 7, func() error { return errors.New("disk full") })
	if err := g.Do("r", 6, nil); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("token 6 after a failed write with 7: %v", err)
	}
}

// Check and write are atomic: concurrent writers with interleaved tokens never
// let an older token write after a newer one.
func TestGuardConcurrent(t *testing.T) {
	var g fencing.Guard
	var mu sync.Mutex
	var order []dlock.Token
	var wg sync.WaitGroup
	for tok := dlock.Token(1); tok <= 200; tok++ {
		wg.Go(func() {
			g.Do("r", tok, func() error {
				mu.Lock()
				order = append(order, tok)
				mu.Unlock()
				return nil
			})
		})
	}
	wg.Wait()
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("write with token %d ran after %d", order[i], order[i-1])
		}
	}
}

func ExampleGuard() {
	var storage fencing.Guard
	fmt.Println(storage.Do("invoice/7", 34, func() error { return nil })) // the current holder
	err := storage.Do("invoice/7", 33, func() error { return nil })       // a holder that paused
	fmt.Println(err)
	// Output:
	// <nil>
	// fencing: resource "invoice/7": token 33 rejected, token 34 was already accepted: stale fencing token
}
