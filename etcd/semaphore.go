// Counted semaphores (backend.AcquireRequest.Permits): a revision-ordered
// waiting room and one lock name per slot.

package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// A counted semaphore KEY of n permits lives under base = LockName(prefix,
// KEY + "/permits/"), that is prefix/<escaped KEY>%2Fpermits%2F:
//
//	base + "<i>/<lease hex>-<seq>"  a holder of slot i: a key under the lock name of
//	                                PermitKey(KEY, i), which no other key may share
//	base + "/<lease hex>-<seq>"     a waiter, in the waiting room (the lock name of
//	                                KEY + "/permits/"), served in create-revision order
//
// Both carry the acquirer's etcd lease (the driver's shared one) and the
// value "permits=<n> <label>". The slots and the waiting room are one key
// range, [base + "/", base + ":"): '/' and the digits are consecutive
// bytes. A slot is free when no key is under its lock name, so a plain
// dlock lock, concurrency.Mutex or `etcdctl lock` of a slot key holds the
// slot too; a permit's token is its key's create revision, strictly
// increasing per slot because a slot's next key is created only once the
// last one is gone.
const (
	permitsValue = "permits=" // the value's prefix, then n, ' ' and the label
	maxTrySlots  = 8          // the slots one try names in its transaction, lowest first
)

// semKeys names the keys of a counted semaphore.
type semKeys struct {
	base string // LockName(prefix, key + "/permits/")
	n    int
}

func (d *Driver) semKeys(key string, n int) semKeys {
	return semKeys{base: LockName(d.prefix, key+"/permits/"), n: n}
}

// room is the prefix of the waiting room's keys.
func (s semKeys) room() string { return s.base + "/" }

// slot is the lock name (with its '/') of slot i.
func (s semKeys) slot(i int) string { return s.base + strconv.Itoa(i) + "/" }

// slotsFrom and end bound the slots' keys; [room(), end) holds the slots'
// and the waiting room's.
func (s semKeys) slotsFrom() string { return s.base + "0" }
func (s semKeys) end() string       { return s.base + ":" }

// readAll reads every waiter's and holder's key.
func (s semKeys) readAll() clientv3.Op {
	return clientv3.OpGet(s.room(), clientv3.WithRange(s.end()))
}

// noWaiters holds when the waiting room is empty.
func (s semKeys) noWaiters() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.room()), "=", 0).WithPrefix()
}

// slotFree holds when no key is under slot i's lock name.
func (s semKeys) slotFree(i int) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.slot(i)), "=", 0).WithPrefix()
}

// permitValue is the value of a permit's key, a holder's or a waiter's.
func permitValue(n int, label string) string {
	return permitsValue + strconv.Itoa(n) + " " + label
}

// parsePermitValue reads a value permitValue wrote; ok is false for any
// other (another client's key under a slot's lock name).
func parsePermitValue(v []byte) (n int, label string, ok bool) {
	rest, found := strings.CutPrefix(string(v), permitsValue)
	if !found {
		return 0, "", false
	}
	num, label, found := strings.Cut(rest, " ")
	if !found {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return 0, "", false
	}
	return n, label, true
}

// isPermitKey reports whether k, a key under lock name, is a permit's (a
// holder's or a waiter's): "<lease hex>-<seq>" directly under name, which
// no lock's key is (concurrency.Mutex's is the lease in hex, dlock's are
// under write/ and read/).
func isPermitKey(name, k string) bool {
	rest, ok := strings.CutPrefix(k, name)
	return ok && strings.IndexByte(rest, '-') > 0 && !strings.Contains(rest, "/")
}

// isWaitingRoom reports whether the keys kvs under the lock name of key are
// a semaphore's waiting room: key ends with "/permits/" and every key is a
// permit's.
func isWaitingRoom(key, name string, kvs []*mvccpb.KeyValue) bool {
	if !strings.HasSuffix(key, "/permits/") {
		return false
	}
	for _, kv := range kvs {
		if !isPermitKey(name, string(kv.Key)) {
			return false
		}
	}
	return true
}

// semState is what a read of [room(), end) tells.
type semState struct {
	rev     int64              // the revision read at
	waiters []*mvccpb.KeyValue // in create-revision order
	slots   []*mvccpb.KeyValue // the keys under the slots' lock names
	taken   []bool             // slots in [0, n) with a key under their lock name
	other   int                // a number of permits another holder or waiter uses; 0 if none
	otherAt string             // that key
}

func (s semKeys) state(rev int64, kvs []*mvccpb.KeyValue) semState {
	st := semState{rev: rev, taken: make([]bool, s.n)}
	for _, kv := range kvs {
		k := string(kv.Key)
		rest := k[len(s.base):]
		if strings.HasPrefix(rest, "/") {
			st.waiters = append(st.waiters, kv)
		} else {
			// Under a slot's lock name: "<i>/…". Anything else in the range
			// (the keys of a semaphore or lock named KEY/permits/1x…) is
			// not this semaphore's.
			num, _, _ := strings.Cut(rest, "/")
			i, err := strconv.Atoi(num)
			if err != nil || i < 0 || strconv.Itoa(i) != num {
				continue
			}
			st.slots = append(st.slots, kv)
			if i < s.n {
				st.taken[i] = true
			}
		}
		if n, _, ok := parsePermitValue(kv.Value); ok && n != s.n && st.other == 0 {
			st.other, st.otherAt = n, k
		}
	}
	slices.SortFunc(st.waiters, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	return st
}

// free returns the lowest free slot, -1 if none.
func (st semState) free() int { return slices.Index(st.taken, false) }

// mismatch is the error of a state in which another holder or waiter uses
// another number of permits, nil if none does.
func (st semState) mismatch(n int) error {
	if st.other == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s uses %d permits, this request %d", backend.ErrSizeMismatch, st.otherAt, st.other, n)
}

// stateOf reads the state out of a response whose last op, in the branch
// taken, is readAll.
func (s semKeys) stateOf(rev int64, rs []*etcdserverpb.ResponseOp) semState {
	for len(rs) > 0 {
		last := rs[len(rs)-1]
		if r := last.GetResponseRange(); r != nil {
			return s.state(rev, r.Kvs)
		}
		t := last.GetResponseTxn()
		if t == nil {
			break
		}
		rs = t.Responses
	}
	return s.state(rev, nil)
}

// acquirer is one counted acquire: the semaphore's keys, and the keys and
// value it writes with its lease.
type acquirer struct {
	s   semKeys
	ls  *lease
	id  string // "<lease hex>-<seq>": the last segment of its keys
	val string // permitValue(n, label)
	own string // its key in the waiting room, once it waits
	rev int64  // own's create revision
}

// slotKey is the key the acquirer holds slot i with.
func (a *acquirer) slotKey(i int) string { return a.s.slot(i) + a.id }

// gate is the condition of the acquirer's claims: nobody waits, or, once
// it waits, its own key is still in the room and no older key is.
func (a *acquirer) gate() []clientv3.Cmp {
	if a.own == "" {
		return []clientv3.Cmp{a.s.noWaiters()}
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(a.own), "=", a.rev),
		clientv3.Compare(clientv3.CreateRevision(a.s.room()), ">", a.rev-1).WithPrefix(),
	}
}

// grab is what a claim of slot i writes: the slot's key, and for a waiter
// the deletion of its key in the room.
func (a *acquirer) grab(i int) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(a.slotKey(i), a.val, clientv3.WithLease(a.ls.id))}
	if a.own != "" {
		ops = append(ops, clientv3.OpDelete(a.own))
	}
	return ops
}

// tried are the keys a failed claimFirst may have written.
func (a *acquirer) tried() []string {
	keys := make([]string, 0, maxTrySlots+1)
	for i := range min(a.s.n, maxTrySlots) {
		keys = append(keys, a.slotKey(i))
	}
	if a.own != "" {
		keys = append(keys, a.own)
	}
	return keys
}

// claimFirst is one transaction: if the gate holds, it takes the lowest
// free slot of the first maxTrySlots, provided every holder's key there
// records n (or there is none); otherwise it reads every key of the
// semaphore. It returns the slot taken, -1 if none (and the state read).
func (d *Driver) claimFirst(ctx context.Context, a *acquirer) (int, semState, *clientv3.TxnResponse, error) {
	s := a.s
	k := min(s.n, maxTrySlots)
	// The chain: slot 0 if free, else slot 1 if free, ..., else read.
	chain := []clientv3.Op{s.readAll()}
	for i := k - 1; i >= 0; i-- {
		chain = []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{s.slotFree(i)}, a.grab(i), chain)}
	}
	// Every key in the slots' range records n: a compare of values fails on
	// an empty range, hence the empty case first.
	lo, hi := permitsValue+strconv.Itoa(s.n), permitsValue+strconv.Itoa(s.n)+"!" // "…n " and "…n <label>" lie between
	agreed := clientv3.OpTxn([]clientv3.Cmp{
		clientv3.Compare(clientv3.Value(s.slotsFrom()), ">", lo).WithRange(s.end()),
		clientv3.Compare(clientv3.Value(s.slotsFrom()), "<", hi).WithRange(s.end()),
	}, chain, []clientv3.Op{s.readAll()})
	empty := clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.slotsFrom()), "=", 0).WithRange(s.end())},
		a.grab(0), []clientv3.Op{agreed})
	resp, err := d.commit(ctx, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return d.cli.Txn(rctx).If(a.gate()...).Then(empty).Else(s.readAll()).Commit()
	})
	if err != nil {
		return -1, semState{}, nil, err
	}
	if !resp.Succeeded {
		return -1, s.stateOf(resp.Header.Revision, resp.Responses), resp, nil
	}
	t := firstTxn(resp.Responses) // empty
	if t.GetSucceeded() {
		return 0, semState{}, resp, nil
	}
	if t = firstTxn(t.GetResponses()); t.GetSucceeded() { // agreed
		for i := range k {
			t = firstTxn(t.GetResponses()) // slot i's
			if t.GetSucceeded() {
				return i, semState{}, resp, nil
			}
		}
	}
	return -1, s.stateOf(resp.Header.Revision, resp.Responses), resp, nil
}

// claim is one transaction: if the gate holds, slot i is free and no key of
// the slots' range was created or changed after revision seen (no holder
// that uses another n came), it takes slot i; otherwise it reads every key
// of the semaphore.
func (d *Driver) claim(ctx context.Context, a *acquirer, i int, seen int64) (bool, semState, *clientv3.TxnResponse, error) {
	cmps := append(a.gate(),
		a.s.slotFree(i),
		clientv3.Compare(clientv3.ModRevision(a.s.slotsFrom()), "<", seen+1).WithRange(a.s.end()))
	resp, err := d.commit(ctx, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return d.cli.Txn(rctx).If(cmps...).Then(a.grab(i)...).Else(a.s.readAll()).Commit()
	})
	if err != nil {
		return false, semState{}, nil, err
	}
	if resp.Succeeded {
		return true, semState{}, resp, nil
	}
	return false, a.s.stateOf(resp.Header.Revision, resp.Responses), resp, nil
}

// firstTxn is the answer of the nested transaction that rs begins with, nil
// if there is none.
func firstTxn(rs []*etcdserverpb.ResponseOp) *etcdserverpb.TxnResponse {
	if len(rs) == 0 {
		return nil
	}
	return rs[0].GetResponseTxn()
}

// commit sends a transaction that may write. It outlives ctx by up to
// cancelGrace (graceCtx): its answer tells what there is to delete.
func (d *Driver) commit(ctx context.Context, txn func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	rctx, done := d.graceCtx(ctx)
	resp, err := txn(rctx)
	done()
	return resp, err
}

// errUnknown wraps the error of a claim whose outcome is unknown: the keys
// it may have written must be deleted.
type errUnknown struct {
	err  error
	keys []string
}

func (e *errUnknown) Error() string { return e.err.Error() }
func (e *errUnknown) Unwrap() error { return e.err }

// settle makes the claims a's state allows until one takes a slot (its
// index and revision), or the state says to stop: to wait (-1, with the
// state), or to fail (an error; an *errUnknown if a claim's outcome is
// unknown). A holder or waiter that uses another n fails it with
// ErrSizeMismatch; a waiter whose key left the room with errWaiterGone.
func (d *Driver) settle(ctx context.Context, a *acquirer, st semState) (int, int64, semState, error) {
	for attempts := 0; ; attempts++ {
		if err := st.mismatch(a.s.n); err != nil {
			return -1, 0, st, err
		}
		if a.own != "" {
			pos := slices.IndexFunc(st.waiters, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == a.own })
			switch {
			case pos < 0 || st.waiters[pos].CreateRevision != a.rev:
				return -1, 0, st, errWaiterGone
			case pos > 0:
				return -1, 0, st, nil // older waiters first
			}
		} else if len(st.waiters) > 0 {
			return -1, 0, st, nil
		}
		// A free slot the first claim did not name (beyond the first
		// maxTrySlots, or among them beside another client's key): claim it
		// on the state read. Each failure means another acquirer took or
		// changed a slot meanwhile; after a few, wait for the next change.
		i := st.free()
		if i < 0 || attempts == 3 || ctx.Err() != nil {
			return -1, 0, st, ctx.Err()
		}
		ok, next, resp, err := d.claim(ctx, a, i, st.rev)
		if err != nil {
			keys := []string{a.slotKey(i)}
			if a.own != "" {
				keys = append(keys, a.own)
			}
			return -1, 0, st, &errUnknown{err, keys}
		}
		if ok {
			return i, resp.Header.Revision, st, nil
		}
		st = next
	}
}

// enqueuePermit is enqueue for a counted request: one attempt with ls, and
// a wait in the waiting room if req.Wait. name is the acquire's own name in
// ls's records (no key is under it). Whatever it returns other than a
// grant, it leaves no key behind.
//
// The first request is one transaction (claimFirst): if nobody waits, it
// takes the lowest free slot of the first maxTrySlots whose holders all
// record n. If that fails it has read the semaphore: a holder or waiter
// that uses another n refuses the request (ErrSizeMismatch); a free slot
// beyond those (or among them, beside another client's key) is claimed by a
// transaction conditional on what was read (settle); a try fails (ErrHeld)
// when every slot is held or someone waits. A waiting request puts its key
// in the waiting room and waits until it heads the room (watching the
// waiter before it) and a slot is free (watching the slots' deletions);
// then one transaction moves it from the room to the slot.
func (d *Driver) enqueuePermit(ctx context.Context, req backend.AcquireRequest, name string, ls *lease) (*backend.Grant, error) {
	a := &acquirer{
		s:   d.semKeys(req.Key, req.Permits),
		ls:  ls,
		id:  strconv.FormatInt(int64(ls.id), 16) + "-" + strconv.FormatUint(d.permitSeq.Add(1), 10),
		val: permitValue(req.Permits, req.Label),
	}
	g := &grant{name: name, ls: ls, valuePrefix: a.val[:len(a.val)-len(req.Label)]}

	// failed cleans up after a request whose outcome is unknown: the keys
	// it may have written are deleted.
	failed := func(err error, keys []string) (*backend.Grant, error) {
		if isLeaseNotFound(err) {
			d.detach(ls, name)
			return nil, err // nothing was written
		}
		d.retire(ls)
		d.unkeyAll(ls, name, keys)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("acquire a permit of %s: %w", a.s.base, err)
	}
	// nothing returns err with nothing held or queued.
	nothing := func(err error) (*backend.Grant, error) {
		if ls.shared == nil {
			d.putLease(ls)
		}
		d.detach(ls, name)
		return nil, err
	}
	granted := func(i int, rev int64) (*backend.Grant, error) {
		g.key, g.rev = a.slotKey(i), rev
		if ctx.Err() != nil {
			d.unkey(ls, name, g.key, g.rev)
			return nil, ctx.Err()
		}
		bg, err := d.granted(req, g)
		if err != nil {
			return nil, err
		}
		bg.Key = backend.PermitKey(req.Key, i)
		return bg, nil
	}

	i, st, resp, err := d.claimFirst(ctx, a)
	if err != nil {
		return failed(err, a.tried())
	}
	if i >= 0 {
		return granted(i, resp.Header.Revision)
	}
	i, rev, st, err := d.settle(ctx, a, st)
	var unknown *errUnknown
	switch {
	case errors.As(err, &unknown):
		return failed(unknown.err, unknown.keys)
	case err != nil:
		return nothing(err)
	case i >= 0:
		return granted(i, rev)
	case !req.Wait && len(st.waiters) > 0:
		return nothing(fmt.Errorf("%w: %d waiting for a permit", backend.ErrHeld, len(st.waiters)))
	case !req.Wait && st.free() >= 0:
		return nothing(fmt.Errorf("%w: other acquirers took or changed the free slots of %d permits meanwhile", backend.ErrHeld, a.s.n))
	case !req.Wait:
		return nothing(fmt.Errorf("%w: all %d permits are held", backend.ErrHeld, a.s.n))
	}

	// Wait in the room.
	own := a.s.room() + a.id
	resp, err = d.commit(ctx, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return d.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(own), "=", 0)).
			Then(clientv3.OpPut(own, a.val, clientv3.WithLease(ls.id)), a.s.readAll()).
			Commit()
	})
	if err != nil {
		return failed(err, []string{own})
	}
	if !resp.Succeeded {
		return failed(fmt.Errorf("key %s already exists", own), nil)
	}
	a.own, a.rev = own, resp.Header.Revision
	g.key, g.rev = own, a.rev // the waiter's, for its renewals
	if ctx.Err() != nil {
		d.unkey(ls, name, own, a.rev)
		return nil, ctx.Err()
	}
	i, rev, err = d.waitPermit(ctx, a, g, a.s.stateOf(resp.Header.Revision, resp.Responses))
	switch {
	case errors.As(err, &unknown):
		return failed(unknown.err, unknown.keys)
	case err != nil:
		d.unkey(ls, name, own, a.rev)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, errWaiterGone) || errors.Is(err, backend.ErrSizeMismatch) {
			return nil, err
		}
		return nil, fmt.Errorf("acquire a permit of %s: %w", a.s.base, err)
	}
	return granted(i, rev)
}

// waitPermit waits, with g the waiter's key in the room and st the state
// read when it was put there, until it heads the room and a slot is free,
// and claims the slot. It returns the slot and the revision of the claim.
// After each wake-up one transaction claims a slot or reads the state
// (claimFirst).
func (d *Driver) waitPermit(ctx context.Context, a *acquirer, g *grant, st semState) (int, int64, error) {
	var bo backend.Backoff
	for {
		i, rev, next, err := d.settle(ctx, a, st)
		if err != nil || i >= 0 {
			return i, rev, err
		}
		st = next
		if pos := slices.IndexFunc(st.waiters, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == a.own }); pos > 0 {
			// Wait for the waiter before ours.
			pred := st.waiters[pos-1]
			err = d.awaitDelete(ctx, g, string(pred.Key), pred.CreateRevision, st.rev)
		} else if st.free() >= 0 {
			// Head of the room with a slot free, but its claims failed:
			// others changed the slots meanwhile. Pause, then look again
			// (no deletion may come to wake it).
			err = backend.Sleep(ctx, bo.Next())
		} else {
			// Head of the room, every slot held: wait for a slot's key to go.
			err = d.awaitSlot(ctx, g, a.s, st)
		}
		if err := d.waitFailed(ctx, err, &bo); err != nil {
			return -1, 0, err
		}
		if d.renewIn(g) <= 0 {
			if err := d.renewWaiting(ctx, g); errors.Is(err, errWaiterGone) {
				return -1, 0, err
			}
		}
		i, next, resp, err := d.claimFirst(ctx, a)
		switch {
		case err != nil:
			// Applied or not: the caller deletes the keys it may have
			// written (Acquire queues again after a transient error).
			return -1, 0, &errUnknown{err, a.tried()}
		case i >= 0:
			return i, resp.Header.Revision, nil
		}
		st = next
		bo.Reset()
	}
}

// waitFailed returns nil if a wait may go on after err (nil, or a watch or
// renewal that failed, after a pause), else the error to give up with.
func (d *Driver) waitFailed(ctx context.Context, err error, bo *backend.Backoff) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil:
		return nil
	case errors.Is(err, errWaiterGone):
		return err
	}
	return backend.Sleep(ctx, bo.Next())
}

// awaitSlot waits until a key of the slots of s is deleted after st was
// read, renewing g's lease meanwhile (awaitDeletion: if the server's revision
// is past st's once the watch is in place, it returns at once when a key st
// saw is gone).
func (d *Driver) awaitSlot(ctx context.Context, g *grant, s semKeys, st semState) error {
	return d.awaitDeletion(ctx, g, s.slotsFrom(), s.end(), st.rev, func(ctx context.Context) (bool, error) {
		return d.slotGone(ctx, s, st)
	})
}

// slotGone reports whether a key of the slots that st saw is gone (or was
// created again).
func (d *Driver) slotGone(ctx context.Context, s semKeys, st semState) (bool, error) {
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Get(rctx, s.slotsFrom(), clientv3.WithRange(s.end()), clientv3.WithKeysOnly())
	if err != nil {
		return false, err
	}
	now := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		now[string(kv.Key)] = kv.CreateRevision
	}
	for _, kv := range st.slots {
		if now[string(kv.Key)] != kv.CreateRevision {
			return true, nil
		}
	}
	return false, nil
}

// unkeyAll deletes the keys of ls among keys (each if it is still ls's),
// in one transaction, or revokes ls if it is a lease of its own; if that
// fails, each key is deleted in the background (see unkey).
func (d *Driver) unkeyAll(ls *lease, name string, keys []string) {
	switch {
	case ls.shared == nil:
		d.revoke(ls)
		return
	case len(keys) == 0:
		d.detach(ls, name)
		return
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", ls.id)}, []clientv3.Op{clientv3.OpDelete(k)}, nil)
	}
	ctx, cancel := d.reqCtx(d.bg)
	_, err := d.cli.Txn(ctx).Then(ops...).Commit()
	cancel()
	if err == nil {
		d.detach(ls, name)
		return
	}
	for _, k := range keys {
		d.deleteLater(ls, name, k, 0)
	}
}
