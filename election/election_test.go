package election_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	_ "github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, name string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), "mem://"+name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestObserveRejectsBadInterval(t *testing.T) {
	l := open(t, t.Name())
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := election.Observe(context.Background(), l, "e", election.WithInterval(d)); !errors.Is(err, election.ErrInvalidInterval) {
			t.Errorf("Observe with interval %v: %v, want ErrInvalidInterval", d, err)
		}
	}
}

func TestCampaignHonoursCtx(t *testing.T) {
	l := open(t, t.Name())
	ld, err := election.Campaign(context.Background(), l, "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Resign(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = election.Campaign(ctx, open(t, t.Name()), "e", "b")
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Campaign while another leads, ctx ending: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if _, err := election.Campaign(context.Background(), l, "f", "bad\x00value"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Campaign with a value that is not printable: %v, want ErrInvalidOption", err)
	}
}

// TestRunCampaignsAgain: Run resigns after each term and campaigns again,
// calling OnStoppedLeading after every term, until the term's work returns
// ErrStop; while it waits to lead, ctx's end returns ctx's error.
func TestRunCampaignsAgain(t *testing.T) {
	l := open(t, t.Name())
	var started, stopped, terms int
	var tokens []dlock.Token
	err := election.Run(context.Background(), election.Config{
		Locker: l,
		Name:   "e",
		Value:  "v",
		OnStartedLeading: func(ctx context.Context, ld *election.Leadership) error {
			started++
			terms++
			tokens = append(tokens, ld.Token())
			if ld.Value() != "v" || ld.Name() != "e" {
				t.Errorf("leadership %q/%q, want e/v", ld.Name(), ld.Value())
			}
			if terms == 3 {
				return election.ErrStop
			}
			return nil
		},
		OnStoppedLeading: func(ld *election.Leadership, err error) {
			stopped++
			if err != nil {
				t.Errorf("OnStoppedLeading after a clean term: %v", err)
			}
			if !errors.Is(ld.Err(), dlock.ErrReleased) {
				t.Errorf("term not resigned: %v", ld.Err())
			}
		},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if started != 3 || stopped != 3 || terms != 3 {
		t.Errorf("started %d, stopped %d, terms %d; want 3 each", started, stopped, terms)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("term tokens %v do not increase", tokens)
		}
	}
	in, err := election.Leader(context.Background(), l, "e")
	if err != nil || in.Led {
		t.Errorf("Leader after Run stopped: %+v %v, want nobody", in, err)
	}

	other, err := election.Campaign(context.Background(), l, "e", "other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Resign(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = election.Run(ctx, election.Config{Locker: open(t, t.Name()), Name: "e", Value: "v",
		OnStartedLeading: func(context.Context, *election.Leadership) error {
			t.Error("ran while another leads")
			return nil
		}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run while another leads, ctx ending: %v, want DeadlineExceeded", err)
	}
}

// TestObserveSendsChanges: Observe sends the current state, then each new
// term and the end of the last, and closes its channel when ctx ends.
func TestObserveSendsChanges(t *testing.T) {
	l := open(t, t.Name())
	ctx, cancel := context.WithCancel(context.Background())
	seen, err := election.Observe(ctx, l, "e", election.WithInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if in := <-seen; in.Led {
		t.Fatalf("first read: %+v, want nobody leading", in)
	}
	for _, v := range []string{"a", "b"} {
		ld, err := election.Campaign(ctx, l, "e", v)
		if err != nil {
			t.Fatal(err)
		}
		if in := <-seen; !in.Led || in.Value != v || in.Token != uint64(ld.Token()) {
			t.Errorf("observed %+v, want %q with token %d", in, v, ld.Token())
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if in := <-seen; in.Led {
			t.Errorf("observed %+v after the resign, want nobody", in)
		}
	}
	cancel()
	for range seen {
	}
}

// TestRunOnNewLeader: a candidate's OnNewLeader hears the other candidate
// lead, then itself, with its proclaimed value, and nobody once it resigned;
// Run's goroutine ends with Run (goleak).
func TestRunOnNewLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other, err := election.Campaign(ctx, open(t, t.Name()), "e", "other")
	if err != nil {
		t.Fatal(err)
	}
	heard := make(chan election.Info, 16)
	cfg := election.Config{
		Locker:      open(t, t.Name()),
		Name:        "e",
		Value:       "me",
		OnNewLeader: func(in election.Info) { heard <- in },
		OnStartedLeading: func(_ context.Context, ld *election.Leadership) error {
			if err := ld.Proclaim(ctx, "me, proclaimed"); err != nil {
				return err
			}
			<-time.After(50 * time.Millisecond) // long enough to be observed leading
			return election.ErrStop
		},
	}
	ran := make(chan error, 1)
	go func() { ran <- election.Run(ctx, cfg) }()
	next := func(what string) election.Info {
		t.Helper()
		select {
		case in := <-heard:
			return in
		case <-time.After(5 * time.Second):
			t.Fatalf("OnNewLeader: %s not heard within 5s", what)
		}
		return election.Info{}
	}
	if in := next("the other leader"); !in.Led || in.Value != "other" || in.Token != uint64(other.Token()) {
		t.Fatalf("OnNewLeader first heard %+v, want the other candidate", in)
	}
	if err := other.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// Then this candidate, perhaps after nobody, with its value and then
	// its proclaimed one (either may be missed: only the newest is sent).
	var in election.Info
	for in = next("this candidate"); !in.Led; in = next("this candidate") {
	}
	if in.Value != "me" && in.Value != "me, proclaimed" || in.Token <= uint64(other.Token()) {
		t.Fatalf("OnNewLeader heard %+v, want this candidate with a later token than %d", in, other.Token())
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// What it heard before Run returned: this candidate's values, or nobody.
	for len(heard) > 0 {
		if in := <-heard; in.Led && in.Value != "me, proclaimed" && in.Value != "me" {
			t.Fatalf("OnNewLeader heard %+v after this candidate led", in)
		}
	}
}

// TestRunRejectsInvalidConfig: Run checks its Config before it campaigns: a
// missing Locker, Name or OnStartedLeading, or a negative ObserveInterval, is
// an error matching ErrInvalidConfig and dlock.ErrInvalidOption that names
// the field, and nothing is taken.
func TestRunRejectsInvalidConfig(t *testing.T) {
	l := open(t, t.Name())
	work := func(context.Context, *election.Leadership) error { return election.ErrStop }
	for _, tc := range []struct {
		field string
		cfg   election.Config
	}{
		{"Locker", election.Config{Name: "e", OnStartedLeading: work}},
		{"Name", election.Config{Locker: l, OnStartedLeading: work}},
		{"OnStartedLeading", election.Config{Locker: l, Name: "e"}},
		{"ObserveInterval", election.Config{Locker: l, Name: "e", OnStartedLeading: work, ObserveInterval: -time.Second,
			OnNewLeader: func(election.Info) {}}},
	} {
		err := election.Run(context.Background(), tc.cfg)
		if !errors.Is(err, election.ErrInvalidConfig) || !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Run without a valid %s: %v, want ErrInvalidConfig naming it", tc.field, err)
		}
	}
	if in, err := election.Leader(context.Background(), l, "e"); err != nil || in.Led {
		t.Errorf("after the refused Runs: %+v %v, want nobody leading", in, err)
	}
}
