package etcd_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goleak.VerifyTestMain(m)
}

// testPrefix is the prefix every test uses; conformance keys are unique per run.
const testPrefix = "/dlock-test"

// harness runs the conformance suite on a cluster given by its endpoints.
type harness struct {
	endpoints []string
	raw       *clientv3.Client // for Expire, behind the lockers' backs
}

func newHarness(t testing.TB, endpoints []string) *harness {
	return &harness{endpoints: endpoints, raw: rawClient(t, endpoints)}
}

// rawClient returns a clientv3 client closed in t.Cleanup.
func rawClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (h *harness) dsn() string { return "etcd://" + strings.Join(h.endpoints, ",") + testPrefix }

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, h.dsn())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Expire revokes the lease of key's holder, as etcd does when it expires.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.raw.Get(ctx, etcd.LockName(testPrefix, key)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		t.Fatalf("Expire(%q): %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("Expire(%q): key not held", key)
	}
	if _, err := h.raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatalf("Expire(%q): revoke: %v", key, err)
	}
}

// ShortTTL is etcd's shortest lease with the default election timeout (1s).
func (*harness) ShortTTL() time.Duration { return 2 * time.Second }

func TestConformance(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartEtcd(t)
		conformance.Run(t, newHarness(t, []string{srv.Endpoint()}))
	})
	t.Run("cluster3", func(t *testing.T) {
		t.Parallel()
		c := testenv.StartEtcdCluster(t, 3)
		conformance.Run(t, newHarness(t, c.Endpoints()))
	})
}

func BenchmarkConformance(b *testing.B) {
	srv := testenv.StartEtcd(b)
	conformance.RunBenchmarks(b, newHarness(b, []string{srv.Endpoint()}))
}

func openLocker(t testing.TB, dsn string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func tryNotAcquired(t *testing.T, ctx context.Context, l dlock.Locker, key string) {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key)
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatalf("TryAcquire(%q) succeeded while another client holds the lock", key)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q): %v, want ErrNotAcquired", key, err)
	}
}

// etcdctlLock starts `etcdctl lock name -- sh -c script sh arg1` in its own
// process group and returns it and the lines the script prints. The script
// gets the lock's key and create revision in $ETCD_LOCK_KEY and
// $ETCD_LOCK_REV, and arg1 as $1. The cleanup kills the whole group.
func etcdctlLock(t *testing.T, endpoint, name, script, arg1 string) (*exec.Cmd, <-chan string) {
	t.Helper()
	bin := testenv.Binary(t, "etcdctl", "etcd-client")
	cmd := exec.Command(bin, "--endpoints="+endpoint, "lock", name, "--", "sh", "-c", script, "sh", arg1)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 8)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return // waited for: the group is gone
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		for range lines { // EOF once every process holding the pipe is gone
		}
		_ = cmd.Wait()
	})
	return cmd, lines
}

// waitEtcdctl waits for etcdctl to exit after its output ends (reads from
// the pipe must be done before Wait), and checks it succeeded.
func waitEtcdctl(t *testing.T, cmd *exec.Cmd, lines <-chan string) {
	t.Helper()
	for l := range lines {
		t.Errorf("etcdctl printed more: %q", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("etcdctl: %v", err)
	}
}

func recv(t *testing.T, lines <-chan string, d time.Duration, what string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("%s: etcdctl ended without output", what)
		}
		return l
	case <-time.After(d):
		t.Fatalf("%s: no output from etcdctl within %v", what, d)
	}
	return ""
}

// TestInteropEtcdctl: dlock and `etcdctl lock` (Debian's etcd-client) exclude
// each other on the same lock, and hand it over promptly in both directions.
func TestInteropEtcdctl(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	key := "interop/job 1" // a '/' and a space: the name is escaped
	name := etcd.LockName(testPrefix, key)
	if name != testPrefix+"/interop%2Fjob 1" {
		t.Fatalf("LockName = %q", name)
	}

	t.Run("etcdctl holds", func(t *testing.T) {
		// The script holds the lock until the test opens the FIFO.
		fifo := filepath.Join(t.TempDir(), "release")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, lines := etcdctlLock(t, srv.Endpoint(), name, `echo "$ETCD_LOCK_REV $ETCD_LOCK_KEY"; read x < "$1" || true`, fifo)
		rev, held, _ := strings.Cut(recv(t, lines, 10*time.Second, "etcdctl lock"), " ")
		if !strings.HasPrefix(held, name+"/") {
			t.Fatalf("etcdctl holds %q, want a key under %q", held, name+"/")
		}
		tryNotAcquired(t, ctx, l, key)

		got := make(chan *dlock.Lease, 1)
		go func() {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		select {
		case <-got:
			t.Fatal("Acquire returned while etcdctl holds the lock")
		case <-time.After(300 * time.Millisecond): // no signal for "is waiting"; it must not be granted
		}
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		_ = w.Close()
		lease := <-got
		if lease == nil {
			t.FailNow()
		}
		t.Logf("etcdctl released → dlock granted: %v", time.Since(released))
		if d := time.Since(released); d > 2*time.Second {
			t.Errorf("Acquire granted %v after etcdctl's command ended", d)
		}
		if r, _ := strconv.ParseUint(rev, 10, 64); uint64(lease.Token()) <= r {
			t.Errorf("dlock token %d not above etcdctl's revision %s", lease.Token(), rev)
		}
		waitEtcdctl(t, cmd, lines)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("dlock holds", func(t *testing.T) {
		raw := rawClient(t, []string{srv.Endpoint()})
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// Watch the queue to see etcdctl join it.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wch := raw.Watch(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithFilterDelete())

		cmd, lines := etcdctlLock(t, srv.Endpoint(), name, `echo "$ETCD_LOCK_REV"`, "")
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil || len(wr.Events) == 0 {
				t.Fatalf("watch: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("etcdctl did not queue for the lock")
		}
		cancel()
		select {
		case line := <-lines:
			t.Fatalf("etcdctl got the lock while dlock holds it: %q", line)
		case <-time.After(300 * time.Millisecond): // no signal for "still waiting"
		}
		tryNotAcquired(t, ctx, openLocker(t, srv.URL()+testPrefix), key)

		released := time.Now()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		rev := recv(t, lines, 5*time.Second, "etcdctl after dlock's release")
		t.Logf("dlock released → etcdctl granted: %v", time.Since(released))
		if r, _ := strconv.ParseUint(rev, 10, 64); r <= uint64(lease.Token()) {
			t.Errorf("etcdctl's revision %s not above dlock's token %d", rev, lease.Token())
		}
		waitEtcdctl(t, cmd, lines)
	})
}

// TestInteropMutex: dlock and concurrency.Mutex on LockName exclude each other.
func TestInteropMutex(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	key := "interop/mutex"
	s, err := concurrency.NewSession(rawClient(t, []string{srv.Endpoint()}), concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, etcd.LockName(testPrefix, key))

	lease, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while dlock holds the lock: %v, want ErrLocked", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tryNotAcquired(t, ctx, l, key)
	if rev := m.Header().Revision; rev <= int64(lease.Token()) {
		t.Errorf("Mutex got revision %d, not above dlock's token %d", rev, lease.Token())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after Mutex.Unlock: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLeaderFailover: killing the leader of a 3-member cluster while a lease
// is held does not lose the lease, and later tokens are still higher.
func TestLeaderFailover(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	dsn := "etcd://" + strings.Join(c.Endpoints(), ",") + testPrefix
	ctx := testCtx(t)
	// The lease must outlive the election: the last renewal before the kill
	// may be TTL/3 old, and electing a new leader takes 2–3s with etcd's
	// default 1s election timeout (longer on a busy machine).
	const ttl = 9 * time.Second
	a, b := openLocker(t, dsn), openLocker(t, dsn)
	key := "failover"

	lease, err := a.Acquire(ctx, key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	before := lease.Token()
	leader := c.Leader(t)
	killed := time.Now()
	leader.Kill()
	next := c.Leader(t)
	elected := time.Now()
	t.Logf("killed leader %s; %s leads %v later", leader.Name(), next.Name(), elected.Sub(killed))

	// Wait for a renewal sent after the election (its deadline lies a TTL
	// after it). The lease must not end meanwhile. Nothing signals a
	// renewal, so poll the lease's deadline.
	for !lease.Deadline().After(elected.Add(ttl * 9 / 10)) {
		select {
		case <-lease.Done():
			t.Fatalf("lease lost after the leader was killed: %v", lease.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(elected) > 2*ttl {
			t.Fatalf("no renewal in %v after the election; deadline %v", 2*ttl, time.Until(lease.Deadline()))
		}
	}
	t.Logf("renewed %v after the election", time.Since(elected))
	tryNotAcquired(t, ctx, b, key)
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after failover: %v", err)
	}

	after, err := b.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if after.Token() <= before {
		t.Fatalf("token after failover %d not above %d", after.Token(), before)
	}
	// The old leader rejoins; tokens keep increasing.
	leader.Restart()
	if err := after.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := a.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if again.Token() <= after.Token() {
		t.Fatalf("token after the old leader rejoined %d not above %d", again.Token(), after.Token())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTTLRoundsUp: a TTL below etcd's minimum gets the server's minimum, and
// the lease's deadline tells the truth about it.
func TestTTLRoundsUp(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	for _, tc := range []struct {
		ask, want time.Duration
	}{
		{300 * time.Millisecond, 2 * time.Second},  // server minimum
		{2500 * time.Millisecond, 3 * time.Second}, // whole seconds, up
		{7 * time.Second, 7 * time.Second},
	} {
		start := time.Now()
		lease, err := l.Acquire(ctx, "ttl/"+tc.ask.String(), dlock.WithTTL(tc.ask), dlock.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		if got := lease.Deadline().Sub(start); got < tc.want-50*time.Millisecond-tc.want/50 || got > tc.want {
			t.Errorf("TTL %v: deadline %v after the acquire, want just under %v", tc.ask, got, tc.want)
		}
		resp, err := raw.Get(ctx, etcd.LockName(testPrefix, lease.Key())+"/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("holder key: %v, %d keys", err, len(resp.Kvs))
		}
		ttl, err := raw.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil {
			t.Fatal(err)
		}
		if time.Duration(ttl.GrantedTTL)*time.Second != tc.want {
			t.Errorf("TTL %v: server granted %ds, want %v", tc.ask, ttl.GrantedTTL, tc.want)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTryAcquireLeavesNothing: a TryAcquire on a held lock writes nothing.
func TestTryAcquireLeavesNothing(t *testing.T) {
	srv := testenv.StartEtcd(t)
	a, b := openLocker(t, srv.URL()+testPrefix), openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	lease, err := a.Acquire(ctx, "try")
	if err != nil {
		t.Fatal(err)
	}
	rev := func() int64 {
		resp, err := raw.Get(ctx, "any")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	r0 := rev()
	for range 5 {
		tryNotAcquired(t, ctx, b, "try")
	}
	if r1 := rev(); r1 != r0 {
		t.Errorf("5 failed TryAcquire calls moved the revision from %d to %d", r0, r1)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseIsConditional: deleting the holder's key behind dlock's back (as
// a retried `etcdctl del` or a stale Unlock would) makes Release report the
// loss instead of deleting the next holder's key.
func TestReleaseIsConditional(t *testing.T) {
	srv := testenv.StartEtcd(t)
	a, b, c := openLocker(t, srv.URL()+testPrefix), openLocker(t, srv.URL()+testPrefix), openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	name := etcd.LockName(testPrefix, "cond") + "/"
	old, err := a.Acquire(ctx, "cond", dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Delete(ctx, name, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.Done(): // the loss watch reports the deletion
	case <-time.After(10 * time.Second):
		t.Fatal("lease not ended 10s after its key was deleted")
	}
	if !errors.Is(old.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() after the key was deleted: %v", old.Err())
	}
	cur, err := b.Acquire(ctx, "cond")
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("stale Release: %v, want ErrLeaseLost", err)
	}
	tryNotAcquired(t, ctx, c, "cond")
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The same, with the next holder in the same Locker: its key may have
	// the lost holder's name (the shared lease's ID), and the lost holder's
	// release still must not delete it.
	old, err = a.Acquire(ctx, "cond", dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Delete(ctx, name, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	<-old.Done()
	if cur, err = a.Acquire(ctx, "cond"); err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("stale Release in the same Locker: %v, want ErrLeaseLost", err)
	}
	tryNotAcquired(t, ctx, c, "cond")
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDefaultPrefix: a DSN without a path locks under DefaultPrefix.
func TestDefaultPrefix(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL())
	ctx := testCtx(t)
	lease, err := l.Acquire(ctx, "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rawClient(t, []string{srv.Endpoint()}).Get(ctx, "/dlock/jobs%2Fnightly/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(lease.Token()) {
		t.Fatalf("holder key under /dlock/jobs%%2Fnightly/: %v, %v", err, resp.Kvs)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ dsn, want string }{
		{"etcd://127.0.0.1:2379/x?tll=10s", `unknown DSN parameter "tll"`},
		{"etcd://127.0.0.1:2379/x?dial-timeout=soon", "dial-timeout"},
		{"etcd://127.0.0.1:2379/x?ca=/etc/ca.pem", "etcds://"},
		{"etcds://127.0.0.1:2379/x?cert=/c.pem", "cert and key go together"},
		{"etcds://127.0.0.1:2379/x?ca=/no/such/ca.pem", "no/such/ca.pem"},
		{"etcd:///x", "no host"},
		{"etcd://a:1,,b:2/x", "empty host"},
		{"etcd://:pw@127.0.0.1:2379/x", "no user name"},
		{"etcd://127.0.0.1:2379/x?ttl=0s", "ttl"},
	} {
		_, err := dlock.Open(ctx, tc.dsn)
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalidOption mentioning %q", tc.dsn, err, tc.want)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q): the error shows the password: %v", tc.dsn, err)
		}
	}
}

func TestOpenUnreachableHidesPassword(t *testing.T) {
	port := testenv.FreePort(t) // nothing listens there
	dsn := "etcd://user:s3cr%2Ft@127.0.0.1:" + strconv.Itoa(port) + "/x?dial-timeout=300ms"
	start := time.Now()
	_, err := dlock.Open(context.Background(), dsn)
	if err == nil {
		t.Fatal("Open of an unreachable cluster succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v with a 300ms dial timeout", d)
	}
	for _, pw := range []string{"s3cr/t", "s3cr%2Ft"} {
		if strings.Contains(err.Error(), pw) {
			t.Fatalf("error shows the password: %v", err)
		}
	}
	if !strings.Contains(err.Error(), "(etcd)") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("error does not name the backend and the endpoint: %v", err)
	}
	t.Log(err)
}

func TestLockName(t *testing.T) {
	for _, tc := range []struct{ prefix, key, want string }{
		{"/dlock", "jobs/nightly", "/dlock/jobs%2Fnightly"},
		{"/dlock", "a%2Fb", "/dlock/a%252Fb"},
		{"/p", "ключ 🔒", "/p/ключ 🔒"},
		{"/p", "\t\n\x7f.", "/p/%09%0A%7F."},
		{"locks", "..", "locks/.."},
	} {
		if got := etcd.LockName(tc.prefix, tc.key); got != tc.want {
			t.Errorf("LockName(%q, %q) = %q, want %q", tc.prefix, tc.key, got, tc.want)
		}
	}
}

func TestNewDriverErrors(t *testing.T) {
	if _, err := etcd.NewDriver(context.Background(), nil, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("NewDriver(nil): %v", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := etcd.NewDriver(context.Background(), cli, &etcd.Options{RequestTimeout: -1}); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("negative RequestTimeout: %v", err)
	}
	// No server answers: the check fails (see TestNewDriverChecksTheCluster).
	if d, err := etcd.NewDriver(context.Background(), cli, &etcd.Options{RequestTimeout: 200 * time.Millisecond}); err == nil {
		_ = d.Close()
		t.Error("NewDriver with no server succeeded")
	}
}

// Waiters counts the keys queued behind key's holder.
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.raw.Get(ctx, etcd.LockName(testPrefix, key)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("Waiters(%q): %v", key, err)
	}
	return max(int(resp.Count)-1, 0)
}

// Residue lists the keys left under key's lock prefix: the holders' and
// waiters' keys, each attached to its lease. For a permit's slot key,
// NAME/permits/i, it lists the semaphore's waiting room too (the keys
// under the lock name of NAME/permits/).
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefixes := []string{etcd.LockName(testPrefix, key) + "/"}
	if sem, slot, ok := strings.Cut(key, "/permits/"); ok && slot != "" && strings.Trim(slot, "0123456789") == "" {
		prefixes = append(prefixes, etcd.LockName(testPrefix, sem+"/permits/")+"/")
	}
	var left []string
	for _, p := range prefixes {
		resp, err := h.raw.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatalf("Residue(%q): %v", key, err)
		}
		for _, kv := range resp.Kvs {
			left = append(left, string(kv.Key))
		}
	}
	return left
}

// DSN is the DSN NewLocker opens.
func (h *harness) DSN(testing.TB) string { return h.dsn() }

var (
	_ conformance.Inspector = (*harness)(nil)
	_ conformance.DSNer     = (*harness)(nil)
)

// TestHeldLeasesShareOneWatch: the leases a Locker holds share one loss
// watch over its prefix; none has a goroutine of its own, and a key deleted
// behind its holder's back still ends that lease alone, at once.
func TestHeldLeasesShareOneWatch(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	warm, err := l.Acquire(ctx, "watch/warm-up")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(ctx)
	before := testenv.SteadyGoroutines() // the watch opens lossWatchDelay after the grant

	const n = 200
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, "watch/"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	after := testenv.SteadyGoroutines()
	t.Logf("goroutines: %d before, %d with %d more leases held", before, after, n)
	if after-before > 5 {
		t.Errorf("%d held leases added %d goroutines", n, after-before)
	}
	victim := leases[n/2]
	if _, err := raw.Delete(ctx, etcd.LockName(testPrefix, victim.Key())+"/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-victim.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease whose key was deleted was not ended within 5s")
	}
	if !errors.Is(victim.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() after the key was deleted: %v", victim.Err())
	}
	for i, lease := range leases {
		if i == n/2 {
			continue
		}
		if err := lease.Err(); err != nil {
			t.Fatalf("lease %d ended with another's key: %v", i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRenewalsShareKeyChecks: renewals that come at once check their keys
// in one shared transaction, not a Get each, and a key deleted behind its
// holder's back still fails that holder's renewal.
func TestRenewalsShareKeyChecks(t *testing.T) {
	srv := testenv.StartEtcd(t)
	var txns, ranges atomic.Int32
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case "/etcdserverpb.KV/Txn":
			txns.Add(1)
		case "/etcdserverpb.KV/Range":
			ranges.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := testCtx(t)
	l, err := etcd.New(ctx, cli, &etcd.Options{Prefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 50
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, "share/"+strconv.Itoa(i), dlock.WithAutoRenew(false)); err != nil {
			t.Fatal(err)
		}
	}
	refreshAll := func() error {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, lease := range leases {
			wg.Go(func() { errs[i] = lease.Refresh(ctx) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	txns.Store(0)
	ranges.Store(0)
	if err := refreshAll(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d concurrent renewals: %d transactions, %d Gets", n, txns.Load(), ranges.Load())
	if ranges.Load() != 0 || txns.Load() == 0 || txns.Load() > 3 {
		t.Errorf("%d concurrent renewals sent %d transactions and %d Gets; want one or two shared transactions", n, txns.Load(), ranges.Load())
	}
	victim := leases[7]
	if _, err := rawClient(t, []string{srv.Endpoint()}).Delete(ctx, etcd.LockName(testPrefix, victim.Key())+"/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if err := victim.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("renewal after the key was deleted: %v, want ErrLeaseLost", err)
	}
	for i, lease := range leases {
		if i != 7 {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWaiterRidesOutServerDown: a waiting Acquire that starts while the
// server is down (its first requests fail) keeps trying until the server is
// back, and is granted then; before its ctx ends, it never gives up.
func TestWaiterRidesOutServerDown(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix+"?request-timeout=300ms")
	ctx := testCtx(t)
	srv.Kill()
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "down")
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Acquire returned while the server was down: %v", err)
	case <-time.After(time.Second): // several failed attempts at 300ms each
	}
	srv.Restart()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Acquire after the server came back: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire not granted 30s after the server came back")
	}
}
