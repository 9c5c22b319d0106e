package etcd_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestInteropElection: an election run with package election and one run with
// etcd's concurrency.Election on the same name are one election, seen the
// same way from both sides: concurrency.Election.Leader and Observe read
// dlock's leader and its value; dlock's Leader reads a concurrency.Election
// leader, its value and its token (the key's create revision); and each side's
// candidate waits while the other side leads.
func TestInteropElection(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	const name = "interop/election"
	s, err := concurrency.NewSession(rawClient(t, []string{srv.Endpoint()}), concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	native := concurrency.NewElection(s, etcd.LockName(testPrefix, name))

	// dlock leads; etcd's side reads it.
	ours, err := election.Campaign(ctx, l, name, "dlock-leader:1")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := native.Leader(ctx)
	if err != nil {
		t.Fatalf("concurrency.Election.Leader while dlock leads: %v", err)
	}
	if kv := resp.Kvs[0]; string(kv.Value) != "dlock-leader:1" || kv.CreateRevision != int64(ours.Token()) {
		t.Errorf("concurrency.Election.Leader: value %q revision %d, want %q and dlock's token %d", kv.Value, kv.CreateRevision, "dlock-leader:1", ours.Token())
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	observed := native.Observe(octx)
	if r := <-observed; string(r.Kvs[0].Value) != "dlock-leader:1" {
		t.Errorf("concurrency.Election.Observe: %q, want dlock's leader", r.Kvs[0].Value)
	}

	// dlock's Proclaim is etcd's: the native observer sees the new value.
	if err := ours.Proclaim(ctx, "dlock-leader:1b"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	if r := <-observed; string(r.Kvs[0].Value) != "dlock-leader:1b" || r.Kvs[0].CreateRevision != int64(ours.Token()) {
		t.Errorf("concurrency.Election.Observe after dlock's Proclaim: %q (revision %d), want %q (%d)", r.Kvs[0].Value, r.Kvs[0].CreateRevision, "dlock-leader:1b", ours.Token())
	}

	// A native candidate waits while dlock leads, and leads when it resigns.
	campaigned := make(chan error, 1)
	go func() { campaigned <- native.Campaign(ctx, "native-leader:2") }()
	select {
	case err := <-campaigned:
		t.Fatalf("concurrency.Election.Campaign returned (%v) while dlock leads", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ours.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-campaigned; err != nil {
		t.Fatalf("concurrency.Election.Campaign after dlock resigned: %v", err)
	}
	if r := <-observed; string(r.Kvs[0].Value) != "native-leader:2" {
		t.Errorf("concurrency.Election.Observe after the hand-over: %q, want the native leader", r.Kvs[0].Value)
	}

	// etcd's leader, read by dlock; dlock's candidate waits for it.
	in, err := election.Leader(ctx, l, name)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Led || in.Value != "native-leader:2" || in.Token != uint64(native.Rev()) {
		t.Errorf("election.Leader while concurrency.Election leads: %+v, want %q with token %d", in, "native-leader:2", native.Rev())
	}
	// etcd's Proclaim, followed by dlock's Observe (pushed: an hour's interval).
	seen, err := election.Observe(octx, l, name, election.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if in := <-seen; in.Value != "native-leader:2" {
		t.Errorf("election.Observe: %+v, want the native leader", in)
	}
	if err := native.Proclaim(ctx, "native-leader:2b"); err != nil {
		t.Fatal(err)
	}
	select {
	case in := <-seen:
		if !in.Led || in.Value != "native-leader:2b" || in.Token != uint64(native.Rev()) {
			t.Errorf("election.Observe after concurrency.Election.Proclaim: %+v, want %q with token %d", in, "native-leader:2b", native.Rev())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("election.Observe did not see concurrency.Election.Proclaim within 5s")
	}
	if r := <-observed; string(r.Kvs[0].Value) != "native-leader:2b" {
		t.Errorf("concurrency.Election.Observe after its Proclaim: %q", r.Kvs[0].Value)
	}

	next := make(chan *election.Leadership, 1)
	go func() {
		ld, err := election.Campaign(ctx, l, name, "dlock-leader:3")
		if err != nil {
			t.Errorf("Campaign after the native leader resigned: %v", err)
		}
		next <- ld
	}()
	select {
	case <-next:
		t.Fatal("dlock's candidate led while concurrency.Election leads")
	case <-time.After(300 * time.Millisecond):
	}
	if err := native.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ld := <-next
	if ld == nil {
		return
	}
	defer ld.Resign(context.Background())
	if uint64(ld.Token()) <= uint64(native.Rev()) {
		t.Errorf("dlock's term token %d is not above the native term's %d", ld.Token(), native.Rev())
	}
	if r := <-observed; string(r.Kvs[0].Value) != "dlock-leader:3" {
		t.Errorf("concurrency.Election.Observe: %q, want dlock's new leader", r.Kvs[0].Value)
	}
}
