package zookeeper_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// curatorClassPath is the class path of testdata/CuratorPeer.java: Debian's
// libcurator-recipes-java (Curator 5.4; the jar's manifest names
// curator-framework, curator-client, guava and the zookeeper client jars),
// and slf4j-nop (libslf4j-java, a dependency) to keep Curator quiet.
var curatorClassPath = []string{
	"/usr/share/java/curator-recipes.jar",
	"/usr/share/java/slf4j-nop.jar",
}

// curatorPeer is testdata/CuratorPeer.java running as a child process: an
// Apache Curator client the test drives with line commands (see the
// program's comment for them).
type curatorPeer struct {
	t       *testing.T
	in      io.Writer
	lines   <-chan string
	started time.Time
}

// startCurator starts CuratorPeer; connect connects it. The test is skipped
// when java or Curator's jars are missing, or fails instead under CI=true,
// as testenv does for servers. The JVM is killed and waited for in
// t.Cleanup; its stderr is logged if the test failed.
func startCurator(t *testing.T) *curatorPeer {
	t.Helper()
	java := testenv.Binary(t, "java", "zookeeper") // its JRE
	for _, jar := range curatorClassPath {
		if _, err := os.Stat(jar); err != nil {
			const format = "%s not found: install Debian package libcurator-recipes-java (scripts/install-test-deps.sh installs it)"
			if os.Getenv("CI") == "true" {
				t.Fatalf(format+"; CI=true, so this fails instead of skipping", jar)
			}
			t.Skipf(format, jar)
		}
	}
	// The source launcher compiles the program in memory at each start
	// (it needs the jdk.compiler module, which Debian's JRE image has).
	cmd := exec.Command(java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx128m",
		"-cp", strings.Join(curatorClassPath, ":"), "testdata/CuratorPeer.java")
	var stderr bytes.Buffer // written by exec's copying goroutine, read after Wait
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // owned by the cleanup below, which ends it
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-quit:
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		close(quit)
		<-done // every read of the pipe is over: Wait may close it
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("CuratorPeer's stderr:\n%s", stderr.String())
		}
	})
	return &curatorPeer{t: t, in: in, lines: lines, started: time.Now()}
}

// connect connects the peer to addr and waits for its "ready".
func (p *curatorPeer) connect(addr string) {
	p.t.Helper()
	p.send("connect %s", addr)
	p.expectWithin(60*time.Second, "ready") // a JVM and a compile on a busy 2-core machine
	p.t.Logf("CuratorPeer ready %v after its start", time.Since(p.started).Round(time.Millisecond))
}

// curatorPeers hands each subtest of a test the test's peer, or, once a
// subtest has failed, a new peer of its own: a failed subtest may leave the
// peer waiting for a lock, and the answer that comes later must not be read
// as the next subtest's.
type curatorPeers struct {
	shared  *curatorPeer
	addr    string
	tainted bool
}

func (ps *curatorPeers) on(t *testing.T) *curatorPeer {
	t.Helper()
	t.Cleanup(func() { ps.tainted = ps.tainted || t.Failed() })
	if ps.tainted {
		p := startCurator(t)
		p.connect(ps.addr)
		return p
	}
	return ps.shared.on(t)
}

// on returns p for use by t, a subtest of the test that started it.
func (p *curatorPeer) on(t *testing.T) *curatorPeer {
	q := *p
	q.t = t
	return &q
}

// send writes one command line.
func (p *curatorPeer) send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		p.t.Fatalf("CuratorPeer: send %q: %v", fmt.Sprintf(format, args...), err)
	}
}

// next returns the peer's next line, failing if none comes within bound.
func (p *curatorPeer) next(bound time.Duration, what string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("CuratorPeer exited while the test waited for %s", what)
		}
		return l
	case <-time.After(bound):
		p.t.Fatalf("CuratorPeer: no %s within %v", what, bound)
		return ""
	}
}

func (p *curatorPeer) expectWithin(bound time.Duration, want string) {
	p.t.Helper()
	if got := p.next(bound, fmt.Sprintf("%q", want)); got != want {
		p.t.Fatalf("CuratorPeer said %q, want %q", got, want)
	}
}

// expect fails unless the peer's next line is want.
func (p *curatorPeer) expect(want string) {
	p.t.Helper()
	p.expectWithin(waitBound, want)
}

// do sends a command and expects its answer.
func (p *curatorPeer) do(cmd, want string) {
	p.t.Helper()
	p.send("%s", cmd)
	p.expect(want)
}

// ask sends a query, "VERB H ...", and returns the value in its answer,
// "VERB H VALUE".
func (p *curatorPeer) ask(cmd string) string {
	p.t.Helper()
	p.send("%s", cmd)
	f := strings.Fields(cmd)
	prefix := f[0] + " " + f[1]
	got := p.next(waitBound, "the answer to "+cmd)
	if got == prefix {
		return "" // an empty value
	}
	v, ok := strings.CutPrefix(got, prefix+" ")
	if !ok {
		p.t.Fatalf("CuratorPeer answered %q to %q, want %q...", got, cmd, prefix+" ")
	}
	return v
}

// quiet fails if the peer has said something it was not asked for: a
// waiting acquire was granted, or a selector or latch took leadership.
func (p *curatorPeer) quiet(what string) {
	p.t.Helper()
	select {
	case l := <-p.lines:
		p.t.Fatalf("%s: CuratorPeer said %q", what, l)
	default:
	}
}

// TestCurator proves the interoperability the driver claims against Apache
// Curator itself (5.4, Debian's libcurator-recipes-java), driven in a child
// JVM by testdata/CuratorPeer.java: Curator's InterProcessMutex and dlock's
// locks exclude each other on the same path in both directions and queue
// together (Curator takes a dlock reader for one more exclusive holder), and
// Curator's LeaderSelector and dlock's election see the same leader, value
// and participants. Curator's LeaderLatch does not share the path (its
// nodes are "latch-" ones): LeaderLatchDoesNotShare shows what happens.
// dlock's semaphores and Curator's InterProcessSemaphoreV2 count each
// other's leases, in both directions (Semaphore*).
func TestCurator(t *testing.T) {
	peer := startCurator(t) // the JVM starts while the server does
	srv := testenv.StartZooKeeper(t)
	h := newHarness(t, []string{srv.Addr()}, 10*time.Second)
	peer.connect(srv.Addr())
	peers := &curatorPeers{shared: peer, addr: srv.Addr()}
	path := func(key string) string { return zookeeper.LockPath(zookeeper.DefaultRoot, key) }
	shared := mode.WithShared()

	t.Run("CuratorHolds", func(t *testing.T) {
		cur := peers.on(t)
		a, b := h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		cur.do("mutex m1 "+path(k), "ok m1")
		cur.do("acquire m1", "acquired m1")
		q := waitQueue(t, h, k, 1)
		if !curatorName.MatchString(q[0]) {
			t.Fatalf("Curator's lock node is %q; dlock's are _c_<uuid>-lock-<seq>", q[0])
		}
		mustTryFail(t, a, k, "dlock while Curator holds")
		mustTryFail(t, a, k, "a dlock reader while Curator holds", shared)

		got := acquireAsync(testCtx(t), a, k)
		q = waitQueue(t, h, k, 2)
		waitWatched(t, srv, k, q[0]) // dlock found Curator's node ahead and waits for it
		notYet(t, got, "dlock behind Curator")
		if nodes := cur.ask("nodes m1"); nodes != strings.Join(q, ",") {
			t.Errorf("Curator's queue %s, dlock's %s", nodes, strings.Join(q, ","))
		}
		cur.do("release m1", "released m1")
		lease := granted(t, got, "dlock after Curator's release")
		mustTryFail(t, b, k, "a second dlock while dlock holds after Curator")
		mustRelease(t, lease)
	})

	t.Run("DlockHolds", func(t *testing.T) {
		cur := peers.on(t)
		a := h.NewLocker(t)
		k := testKey(t)
		lease := mustAcquire(t, a, k)
		holder := waitQueue(t, h, k, 1)[0]
		cur.do("mutex m2 "+path(k), "ok m2")
		cur.do("acquire m2 200", "notacquired m2")
		waitQueue(t, h, k, 1) // Curator's try left no node

		cur.send("acquire m2")
		q := waitQueue(t, h, k, 2)
		waitWatched(t, srv, k, holder) // Curator found dlock's node ahead and waits for it
		cur.quiet("Curator behind dlock")
		if nodes := cur.ask("nodes m2"); nodes != strings.Join(q, ",") {
			t.Errorf("Curator's queue %s, dlock's %s", nodes, strings.Join(q, ","))
		}
		mustRelease(t, lease)
		cur.expect("acquired m2")
		mustTryFail(t, a, k, "dlock after its release, while Curator holds")
		cur.do("release m2", "released m2")
		mustRelease(t, mustAcquire(t, a, k))
	})

	t.Run("ReadersHold", func(t *testing.T) {
		cur := peers.on(t)
		a, b, c := h.NewLocker(t), h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		ra := mustAcquire(t, a, k, shared)
		rb := mustAcquire(t, b, k, shared)
		readers := waitQueue(t, h, k, 2)
		cur.do("mutex m3 "+path(k), "ok m3")
		cur.do("acquire m3 200", "notacquired m3")

		cur.send("acquire m3")
		waitQueue(t, h, k, 3)
		waitWatched(t, srv, k, readers[1]) // Curator waits for the reader just before it
		cur.quiet("Curator behind two dlock readers")
		// Curator's node is a waiting writer to dlock: a later reader waits.
		mustTryFail(t, c, k, "a dlock reader behind Curator's waiting acquire", shared)

		// The later reader leaves first: Curator looks again, finds the
		// other ahead and waits for it.
		mustRelease(t, rb)
		waitQueue(t, h, k, 2)
		waitWatched(t, srv, k, readers[0])
		cur.quiet("Curator behind a dlock reader")
		mustRelease(t, ra)
		cur.expect("acquired m3")
		mustTryFail(t, c, k, "a dlock reader while Curator holds", shared)
		cur.do("release m3", "released m3")
		mustRelease(t, mustAcquire(t, c, k, shared))
	})

	t.Run("LeaderSelector", func(t *testing.T) {
		cur := peers.on(t)
		a, b := h.NewLocker(t), h.NewLocker(t)
		name := testKey(t)
		ctx := testCtx(t)
		lead, err := election.Campaign(ctx, a, name, "host-a:8080")
		if err != nil {
			t.Fatal(err)
		}
		holder := waitQueue(t, h, name, 1)[0]
		cur.do("selector s1 "+path(name)+" curator-1:9090", "ok s1")
		waitQueue(t, h, name, 2)
		waitWatched(t, srv, name, holder) // the selector waits for dlock's leader
		cur.quiet("Curator's selector while dlock leads")
		if got := cur.ask("leader s1"); got != "host-a:8080" {
			t.Errorf("Curator's getLeader while dlock leads: %q, want host-a:8080", got)
		}
		if got := cur.ask("participants s1"); got != "host-a:8080:1,curator-1:9090:0" {
			t.Errorf("Curator's getParticipants: %q, want host-a:8080:1,curator-1:9090:0 (leader first)", got)
		}
		if got := cur.ask("has s1"); got != "false" {
			t.Errorf("Curator's hasLeadership while dlock leads: %s", got)
		}
		if err := lead.Proclaim(ctx, "host-a:8081"); err != nil {
			t.Fatal(err)
		}
		if got := cur.ask("leader s1"); got != "host-a:8081" {
			t.Errorf("Curator's getLeader after dlock's Proclaim: %q, want host-a:8081", got)
		}

		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		cur.expect("elected s1")
		if in, err := election.Leader(ctx, b, name); err != nil || !in.Led || in.Value != "curator-1:9090" {
			t.Errorf("dlock's Leader while Curator leads: %+v, %v; want curator-1:9090", in, err)
		}
		mustTryFail(t, b, name, "dlock's candidate while Curator's leads")
		next := make(chan *election.Leadership, 1)
		go func() {
			ld, err := election.Campaign(ctx, b, name, "host-b:8080")
			if err != nil {
				t.Error(err)
			}
			next <- ld
		}()
		q := waitQueue(t, h, name, 2)
		waitWatched(t, srv, name, q[0]) // dlock's candidate waits for Curator's leader
		notYet(t, next, "dlock's candidate while Curator's leads")
		if got := cur.ask("participants s1"); got != "curator-1:9090:1,host-b:8080:0" {
			t.Errorf("Curator's getParticipants while it leads: %q, want curator-1:9090:1,host-b:8080:0", got)
		}
		cur.send("resign s1")
		cur.expect("resigned s1")
		ld := <-next
		if ld == nil {
			t.FailNow()
		}
		if got := cur.ask("leader s1"); got != "host-b:8080" {
			t.Errorf("Curator's getLeader after it resigned: %q, want host-b:8080", got)
		}
		cur.do("close s1", "closed s1")
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	})

	testCuratorSemaphore(t, h, peers)

	t.Run("LeaderLatchDoesNotShare", func(t *testing.T) {
		// LeaderLatch names its nodes "_c_<uuid>-latch-<seq>" and sorts by
		// what follows "latch-"; a name without it (dlock's, or
		// LeaderSelector's) sorts as a whole, after every latch node. dlock
		// orders by what follows "lock-" and skips latch nodes. So each
		// leads while the other does: never point a LeaderLatch at a dlock
		// election. This pins what docs/zookeeper.md says.
		cur := peers.on(t)
		a := h.NewLocker(t)
		name := testKey(t)
		ctx := testCtx(t)
		lead, err := election.Campaign(ctx, a, name, "host-a:8080")
		if err != nil {
			t.Fatal(err)
		}
		cur.do("latch l1 "+path(name)+" curator-1:9090", "ok l1")
		cur.expect("elected l1") // despite dlock's leader
		if got := cur.ask("participants l1"); got != "curator-1:9090:1,host-a:8080:0" {
			t.Errorf("LeaderLatch's getParticipants: %q", got)
		}
		if in, err := election.Leader(ctx, a, name); err != nil || in.Value != "host-a:8080" {
			t.Errorf("dlock's Leader beside the latch: %+v, %v", in, err)
		}
		if err := lead.Err(); err != nil {
			t.Errorf("dlock's leader beside the latch: %v", err)
		}
		cur.do("close l1", "closed l1")
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
