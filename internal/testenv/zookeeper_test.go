package testenv

import (
	"bufio"
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// openZooKeeperSession opens a session on addr over the raw protocol and
// returns its id and password, with the connection that keeps it.
func openZooKeeperSession(t *testing.T, addr string, timeout time.Duration) (int64, []byte, net.Conn) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, answerDeadline)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(answerDeadline)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(appendZooKeeperConnect(nil, 0, make([]byte, 16), timeout)); err != nil {
		t.Fatal(err)
	}
	id, got, pw, err := readZooKeeperConnectResponse(bufio.NewReader(conn))
	if err != nil || id == 0 {
		t.Fatalf("new session on %s: id 0x%x, %v", addr, id, err)
	}
	if got != timeout {
		t.Fatalf("negotiated session timeout %v, want %v (tickTime=500 allows 1s–10s)", got, timeout)
	}
	return id, pw, conn
}

// reattach tries to attach to a session from a new connection and reports
// whether the server accepted it (false: the session expired).
func reattach(t *testing.T, addr string, id int64, pw []byte) bool {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, answerDeadline)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(answerDeadline)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(appendZooKeeperConnect(nil, id, pw, 4*time.Second)); err != nil {
		t.Fatal(err)
	}
	got, _, _, err := readZooKeeperConnectResponse(bufio.NewReader(conn))
	if err != nil {
		// Servers may close the connection instead of answering an expired
		// session.
		return false
	}
	return got == id
}

func mustMode(t *testing.T, z *ZooKeeper, want string) {
	t.Helper()
	if got, err := z.Mode(); err != nil || got != want {
		t.Fatalf("server %d (%s) mode = %q, %v; want %q\n%s", z.ID(), z.Addr(), got, err, want, z.LogTail(20))
	}
}

func TestZooKeeperStandalone(t *testing.T) {
	z := StartZooKeeper(t)
	if want := "zk://" + z.Addr() + "/locks"; z.URL("/locks") != want {
		t.Fatalf("URL = %q, want %q", z.URL("/locks"), want)
	}
	mustMode(t, z, "standalone")

	// A session, expired from a second connection with its id and password.
	id, pw, _ := openZooKeeperSession(t, z.Addr(), 4*time.Second)
	if ids, err := z.Sessions(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("Sessions() = %x, %v; want one of them 0x%x", ids, err, id)
	}
	if !reattach(t, z.Addr(), id, pw) {
		t.Fatal("a live session could not be re-attached")
	}
	if err := ExpireZooKeeperSession(z.Addr(), id, pw, answerDeadline); err != nil {
		t.Fatalf("ExpireZooKeeperSession: %v\n%s", err, z.LogTail(20))
	}
	if reattach(t, z.Addr(), id, pw) {
		t.Fatal("the session can still be re-attached after ExpireZooKeeperSession")
	}
	if err := ExpireZooKeeperSession(z.Addr(), id, pw, answerDeadline); err == nil || !strings.Contains(err.Error(), "already expired") {
		t.Fatalf("second ExpireZooKeeperSession: %v, want an already-expired error", err)
	}

	// Paused: the kernel accepts the connection, nothing answers.
	z.Pause()
	if _, err := z.Mode(); err == nil {
		t.Fatal("srvr answered while the server was paused")
	}
	z.Resume()
	mustMode(t, z, "standalone")

	// Killed, then restarted on the same port.
	z.Kill()
	if _, err := net.DialTimeout("tcp", z.Addr(), answerDeadline); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after Kill: %v, want connection refused", err)
	}
	z.Restart()
	mustMode(t, z, "standalone")
}

func TestZooKeeperEnsemble(t *testing.T) {
	e := StartZooKeeperEnsemble(t, 3)
	if len(e.Members) != 3 || len(e.Addrs()) != 3 || !strings.HasPrefix(e.URL("/x"), "zk://127.0.0.1:") ||
		strings.Count(e.URL("/x"), ",") != 2 {
		t.Fatalf("ensemble: %d members, addrs %v, URL %q", len(e.Members), e.Addrs(), e.URL("/x"))
	}
	leader := e.Leader(t)

	// A session opened on a follower survives the leader's death (it is
	// re-attached elsewhere), and can be expired from any member.
	var follower *ZooKeeper
	for _, z := range e.Members {
		if z != leader {
			follower = z
			break
		}
	}
	id, pw, conn := openZooKeeperSession(t, follower.Addr(), 10*time.Second)
	conn.Close()

	leader.Kill()
	newLeader := e.Leader(t)
	if newLeader == leader {
		t.Fatal("the killed server is still the leader")
	}
	if !reattach(t, newLeader.Addr(), id, pw) {
		t.Fatal("session lost in the failover")
	}
	leader.Restart()
	mustMode(t, leader, "follower")
	if err := ExpireZooKeeperSession(leader.Addr(), id, pw, answerDeadline); err != nil {
		t.Fatalf("ExpireZooKeeperSession: %v", err)
	}
	if reattach(t, follower.Addr(), id, pw) {
		t.Fatal("the session can still be re-attached after ExpireZooKeeperSession")
	}

	// A paused member stops answering; the others keep serving.
	follower.Pause()
	if _, err := follower.Mode(); err == nil {
		t.Fatal("srvr answered while the member was paused")
	}
	e2 := &ZooKeeperEnsemble{Members: []*ZooKeeper{newLeader, leader}}
	e2.Leader(t)
	follower.Resume()
	e.Leader(t)
}
