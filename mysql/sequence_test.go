package mysql_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/mysql"
)

const seqParams = "&tokens=sequence"

func newSeqHarness(t testing.TB) *harness {
	h := newHarness(t)
	h.params = seqParams
	return h
}

// TestSequenceConformance runs the conformance suite with tokens=sequence.
func TestSequenceConformance(t *testing.T) {
	conformance.Run(t, newSeqHarness(t))
}

// seqMatrix is the MySQL/MariaDB GET_LOCK driver's row of the fault matrix
// with tokens=sequence.
var seqMatrix = conformance.Matrix{
	conformance.Partition: mysqlMatrix[conformance.Partition],
	conformance.Disconnect: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the server sees the connection close and ends the session at once, freeing the lock; the holder reads the close off its idle connection within 50ms (the watcher's poll), while a waiter is granted within a round trip (GET_LOCK and the token are one statement): the waiter usually wins, and its higher token (UUID_SHORT() drawn after the grant) lets the Guard fence the old holder"},
	conformance.PauseHolder: mysqlMatrix[conformance.PauseHolder],
	conformance.Restart: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "the lock dies with the server (SIGKILL) and the kernel closes its connections: the holder reads the close off its idle connection within 50ms, while a waiter is granted only after the restart and crash recovery; the restart empties the MEMORY marker, so the first grant after it bumps the durable epoch, and its token is above every token of the old epoch: the Guard fences the old holder"},
	conformance.Stall: mysqlMatrix[conformance.Stall],
}

// TestFaultsSequenceTokens runs the fault matrix with tokens=sequence, as
// the deployment mysql-seq.
func TestFaultsSequenceTokens(t *testing.T) {
	conformance.RunFaults(t, faultHarness{newSeqHarness(t)}, seqMatrix)
}

// seqLease takes key with a new Locker of h and returns its token.
func seqGrant(t *testing.T, ctx context.Context, l dlock.Locker, key string) dlock.Token {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	tok := lease.Token()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return tok
}

// TestSequenceTokensSurviveCrash: a burst of sequence-mode grants, then a
// SIGKILL of the server and InnoDB's crash recovery: the first grant after
// it gets a token above every token before, in a higher epoch (the restart
// emptied the MEMORY marker).
func TestSequenceTokensSurviveCrash(t *testing.T) {
	h := newSeqHarness(t)
	ctx := testCtx(t)
	l := open(t, h.DSN(t))
	var highest dlock.Token
	for range 500 {
		highest = max(highest, seqGrant(t, ctx, l, "burst"))
	}
	h.srv.Kill()
	h.srv.Restart()
	lease, err := l.Acquire(ctx, "burst")
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer lease.Release(ctx)
	t.Logf("highest before the crash %d (epoch %d, count %d); first after %d (epoch %d, count %d)",
		highest, highest>>44, highest&(1<<44-1), lease.Token(), lease.Token()>>44, lease.Token()&(1<<44-1))
	if lease.Token() <= highest {
		t.Fatalf("first token after the crash %d ≤ the highest before %d", lease.Token(), highest)
	}
	if lease.Token()>>44 <= highest>>44 {
		t.Fatalf("epoch after the crash %d, want above %d", lease.Token()>>44, highest>>44)
	}
}

// TestSequenceFailback: a session that drew tokens under an epoch, then its
// server replicates another primary's epoch bump (a failover to a replica
// and back, while the session stayed open): its next grant must be above
// every token of the bumped epoch. The test plays the replication: it bumps
// the durable epoch and moves gtid_slave_pos, as applying the other
// primary's transaction does.
func TestSequenceFailback(t *testing.T) {
	h := newSeqHarness(t)
	ctx := testCtx(t)
	l := open(t, h.DSN(t)+"&max_conns=1") // one session: the grants below reuse it
	before := seqGrant(t, ctx, l, "failback")
	var epoch int64
	if err := h.admin.QueryRowContext(ctx, "SELECT epoch FROM dlock_mysql_fence_epoch WHERE id = 1").Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if uint64(epoch) != uint64(before)>>44 {
		t.Fatalf("token %d in epoch %d, the durable epoch is %d", before, before>>44, epoch)
	}
	// The other primary's bump, replicated; its tokens are below
	// (epoch+1)<<44 + 2^44.
	if _, err := h.admin.ExecContext(ctx, "UPDATE dlock_mysql_fence_epoch SET epoch = epoch + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.ExecContext(ctx, "SET GLOBAL gtid_slave_pos = '0-99-7'"); err != nil {
		t.Fatal(err)
	}
	otherMax := dlock.Token((epoch+2)<<44 - 1)
	after := seqGrant(t, ctx, l, "failback")
	t.Logf("before %d (epoch %d); the other primary's tokens up to %d (epoch %d); after %d (epoch %d)",
		before, before>>44, otherMax, otherMax>>44, after, after>>44)
	if after <= otherMax {
		t.Fatalf("token after the replicated bump %d ≤ the other primary's highest %d", after, otherMax)
	}
}

// TestSequenceReadOnly: a grant on a read-only server (a replica) fails
// with ErrReadOnly, not as a held lock, and leaves the lock free.
func TestSequenceReadOnly(t *testing.T) {
	h := newSeqHarness(t)
	ctx := testCtx(t)
	l := open(t, h.DSN(t))
	seqGrant(t, ctx, l, "read-only") // the session has its epoch
	if _, err := h.admin.ExecContext(ctx, "SET GLOBAL read_only = 1"); err != nil {
		t.Fatal(err)
	}
	defer h.admin.ExecContext(context.Background(), "SET GLOBAL read_only = 0")
	_, err := l.TryAcquire(ctx, "read-only")
	if !errors.Is(err, mysql.ErrReadOnly) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a read-only server: %v, want ErrReadOnly", err)
	}
	if id := h.holder(t, "read-only"); id != 0 {
		t.Fatalf("after the refused grant, session %d holds the lock", id)
	}
	if _, err := h.admin.ExecContext(ctx, "SET GLOBAL read_only = 0"); err != nil {
		t.Fatal(err)
	}
	seqGrant(t, ctx, l, "read-only")
}

// TestSequenceRefusesCounterMode: once a database has given sequence
// tokens, a driver in counter mode refuses it (its tokens would be below
// them).
func TestSequenceRefusesCounterMode(t *testing.T) {
	h := newSeqHarness(t)
	ctx := testCtx(t)
	seqGrant(t, ctx, open(t, h.DSN(t)), "mode")
	l, err := dlock.Open(ctx, h.srv.URL("mysql"))
	if err == nil {
		_ = l.Close()
	}
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("counter mode after sequence mode: %v, want ErrInvalidOption", err)
	}
}

// TestSequenceRacingAfterRestart: after a crash, several clients' first
// grants race to find the emptied marker; one bumps the epoch, and every
// client draws under that one epoch (bumps are serialized, and a second
// bump beside a marker others already trust would split the epoch in use).
func TestSequenceRacingAfterRestart(t *testing.T) {
	h := newSeqHarness(t)
	ctx := testCtx(t)
	const n = 6
	ls := make([]dlock.Locker, n)
	for i := range ls {
		ls[i] = open(t, h.DSN(t))
		seqGrant(t, ctx, ls[i], "race")
	}
	var before int64
	if err := h.admin.QueryRowContext(ctx, "SELECT epoch FROM dlock_mysql_fence_epoch WHERE id = 1").Scan(&before); err != nil {
		t.Fatal(err)
	}
	h.srv.Kill()
	h.srv.Restart()
	start := make(chan struct{})
	tokens := make(chan dlock.Token, n)
	errs := make(chan error, n)
	for i, l := range ls {
		go func() {
			<-start
			for {
				lease, err := l.TryAcquire(ctx, "race/"+string(rune('a'+i)))
				if err == nil {
					tokens <- lease.Token()
					errs <- lease.Release(ctx)
					return
				}
				if ctx.Err() != nil {
					tokens <- 0
					errs <- err
					return
				}
				time.Sleep(5 * time.Millisecond) // pacing: recovery announces its end to no one
			}
		}()
	}
	close(start)
	epochs := map[uint64]int{}
	for range n {
		tok := <-tokens
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		epochs[uint64(tok)>>44]++
	}
	var after int64
	if err := h.admin.QueryRowContext(ctx, "SELECT epoch FROM dlock_mysql_fence_epoch WHERE id = 1").Scan(&after); err != nil {
		t.Fatal(err)
	}
	t.Logf("epoch before the crash %d, after %d; grants by epoch %v", before, after, epochs)
	if len(epochs) != 1 || epochs[uint64(before)+1] != n {
		t.Fatalf("grants after the crash by epoch %v, want all %d in epoch %d", epochs, n, before+1)
	}
	if after != before+1 {
		t.Fatalf("the durable epoch went from %d to %d: want one bump", before, after)
	}
}
