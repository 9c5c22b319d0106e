package zookeeper_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// participants lists an election's candidates as Curator's
// LeaderSelector.getParticipants does: the children of the election's node,
// in the order of the sequence number after their last "lock-", each child's
// data as the participant's id; the first is the leader.
func participants(t *testing.T, conn *zk.Conn, path string) []string {
	t.Helper()
	children, _, err := conn.Children(path)
	if err != nil {
		t.Fatalf("children of %s: %v", path, err)
	}
	seq := func(name string) string { return name[strings.LastIndex(name, "lock-")+len("lock-"):] }
	sort.Slice(children, func(i, j int) bool { return seq(children[i]) < seq(children[j]) })
	var ids []string
	for _, c := range children {
		data, _, err := conn.Get(path + "/" + c)
		if err != nil {
			t.Fatalf("get %s: %v", c, err)
		}
		ids = append(ids, string(data))
	}
	return ids
}

// TestElectionParticipants: the candidates of an election run with package
// election are Curator participants — the leader's node first, each node's
// data the candidate's value — and a participant written in Curator's layout
// by another client (a raw go-zookeeper session here) is read by dlock's
// Leader, and dlock's candidate waits behind it.
func TestElectionParticipants(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	h := newHarness(t, []string{srv.Addr()}, 10*time.Second)
	ctx := testCtx(t)
	name := testKey(t)
	path := zookeeper.LockPath(zookeeper.DefaultRoot, name)
	a, b := h.NewLocker(t), h.NewLocker(t)

	lead, err := election.Campaign(ctx, a, name, "host-a:8080")
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan *election.Leadership, 1)
	go func() {
		ld, err := election.Campaign(ctx, b, name, "host-b:8080")
		if err != nil {
			t.Error(err)
		}
		next <- ld
	}()
	deadline := time.Now().Add(10 * time.Second)
	var got []string
	for {
		got = participants(t, h.admin, path)
		if len(got) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(got) != 2 || got[0] != "host-a:8080" || got[1] != "host-b:8080" {
		t.Fatalf("participants %q, want [host-a:8080 host-b:8080] (leader first)", got)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-next
	if second == nil {
		return
	}
	if got := participants(t, h.admin, path); len(got) != 1 || got[0] != "host-b:8080" {
		t.Errorf("participants after the resign: %q, want [host-b:8080]", got)
	}
	if err := second.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	// A participant in Curator's layout, from another client, leads.
	other, _, err := zk.Connect([]string{srv.Addr()}, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	node, err := other.CreateProtectedEphemeralSequential(path+"/lock-", []byte("curator-host:9090"), zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	in, err := election.Leader(ctx, a, name)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Led || in.Value != "curator-host:9090" {
		t.Errorf("Leader while a Curator participant leads: %+v, want curator-host:9090", in)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if ld, err := election.Campaign(cctx, a, name, "host-a:8080"); err == nil {
		_ = ld.Resign(ctx)
		t.Fatal("dlock's candidate led while the Curator participant leads")
	}
	if err := other.Delete(node, -1); err != nil {
		t.Fatal(err)
	}
	ld, err := election.Campaign(ctx, a, name, "host-a:8080")
	if err != nil {
		t.Fatalf("Campaign after the Curator participant left: %v", err)
	}
	_ = ld.Resign(ctx)
}
