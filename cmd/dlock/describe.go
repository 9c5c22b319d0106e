// What dlock ls and dlock inspect show of a key: a lock, a semaphore
// (package semaphore) or a read/write lock (package rwlock), read through
// dlock.Inspect and dlock.List in each package's key layout.

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/rwlock"
	"github.com/dlock-go/dlock/semaphore"
)

// The kinds of what ls and inspect show.
const (
	kindLock      = "lock"
	kindSemaphore = "semaphore"
	kindRWLock    = "rwlock"
)

// view is what dlock ls and dlock inspect show of one key, and their JSON
// (see lsUsage).
type view struct {
	Key  string `json:"key"`
	Kind string `json:"kind"`
	Held bool   `json:"held"`
	// Mode is, when held, "exclusive" for a lock, "write" or "read" for a
	// read/write lock.
	Mode string `json:"mode,omitempty"`
	// Readers is how many hold a read/write lock for reading.
	Readers int `json:"readers,omitempty"`
	// Permits is a semaphore's number of permits, nil where the backend
	// does not record it.
	Permits *int `json:"permits,omitempty"`
	// PermitsHeld is how many of a semaphore's permits are held.
	PermitsHeld *int `json:"permits_held,omitempty"`
	// Holders are the holders the backend reports: a lock's holder (one
	// of them when shared), each permit's, the writer or each reader.
	Holders []holder `json:"holders"`
	// Waiters is how many wait, nil where the backend cannot tell.
	Waiters *int `json:"waiters"`
	// Notes say what the backend cannot tell.
	Notes []string `json:"notes,omitempty"`
}

// holder is one holder of a view: a lease's key, token and holder.
type holder struct {
	Key     string     `json:"key"`
	Role    string     `json:"role,omitempty"` // "writer", "reader", "permit"
	Token   uint64     `json:"token"`
	Label   string     `json:"label"`
	Owner   string     `json:"owner"`
	Granted *time.Time `json:"granted"`
	Expires *time.Time `json:"expires"`
}

func holderOf(info dlock.LockInfo, role string) holder {
	h := holder{Key: info.Key, Role: role, Token: info.Token, Label: info.Label, Owner: info.Owner}
	if !info.Granted.IsZero() {
		t := info.Granted.UTC()
		h.Granted = &t
	}
	if !info.Expires.IsZero() {
		t := info.Expires.UTC()
		h.Expires = &t
	}
	if role == "permit" || role == "reader" {
		// A permit's label in the portable layout is "permits=N LABEL".
		if _, ok := semaphore.ParseLabel(h.Label); ok {
			_, h.Label, _ = strings.Cut(h.Label, " ")
		}
	}
	return h
}

func waitersOf(n int) *int {
	if n < 0 {
		return nil
	}
	return &n
}

func intp(n int) *int { return &n }

// lockView is the view of the lock info.Key.
func lockView(info dlock.LockInfo) view {
	v := view{Key: info.Key, Kind: kindLock, Held: info.Held, Waiters: waitersOf(info.Waiters), Holders: []holder{}}
	if !info.Held {
		return v
	}
	v.Mode = "exclusive"
	if info.Shared > 0 {
		// Shared holds are read/write locks' readers (package rwlock).
		v.Kind, v.Mode, v.Readers = kindRWLock, "read", info.Shared
		v.Holders = append(v.Holders, holderOf(info, "reader"))
		if info.Shared > 1 {
			v.Notes = append(v.Notes, fmt.Sprintf("the backend reports one of the %d readers", info.Shared))
		}
		return v
	}
	v.Holders = append(v.Holders, holderOf(info, ""))
	return v
}

// slotsOf returns the held slots of the semaphore name among infos, by
// slot.
func slotsOf(name string, infos []dlock.LockInfo) []dlock.LockInfo {
	var out []dlock.LockInfo
	for _, in := range infos {
		if _, ok := slotIndex(name, in.Key); ok && in.Held {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b dlock.LockInfo) int {
		i, _ := slotIndex(name, a.Key)
		j, _ := slotIndex(name, b.Key)
		return i - j
	})
	return out
}

// slotIndex returns i if key is NAME/permits/i.
func slotIndex(name, key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, name+"/permits/")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}

// describer reads what a backend keeps of semaphores and read/write locks.
type describer struct {
	l   dlock.Locker
	dsn string
}

// semaphoreView is the view of the semaphore name whose held slots are
// slots (at least one), with queue the state of its queue lock.
func (d *describer) semaphoreView(ctx context.Context, name string, slots []dlock.LockInfo, queue dlock.LockInfo) view {
	v := view{Key: name, Kind: kindSemaphore, Held: len(slots) > 0, PermitsHeld: intp(len(slots)), Holders: []holder{}}
	for _, s := range slots {
		v.Holders = append(v.Holders, holderOf(s, "permit"))
		if n, ok := semaphore.ParseLabel(s.Label); ok && v.Permits == nil {
			v.Permits = intp(n)
		}
	}
	if v.Permits == nil {
		n, err := d.nativePermits(ctx, name)
		switch {
		case err != nil:
			v.Notes = append(v.Notes, fmt.Sprintf("could not read the number of permits: %s", errText(err)))
		case n > 0:
			v.Permits = intp(n)
		default:
			v.Notes = append(v.Notes, "the backend does not report the number of permits")
		}
	}
	// Waiters queue on NAME/permits/queue; its holder is the head.
	switch {
	case !queue.Held:
		v.Waiters = intp(0)
	case queue.Waiters >= 0:
		v.Waiters = intp(1 + queue.Waiters)
	default:
		v.Notes = append(v.Notes, "at least one waits (the backend cannot tell how many)")
	}
	return v
}

// nativePermits reads the number of permits the holders of the semaphore
// name use, in the backend's own layout (Redis, etcd); 0 where dlock cannot
// read it (ZooKeeper's layout, or Redis Sentinel and Cluster).
func (d *describer) nativePermits(ctx context.Context, name string) (int, error) {
	u, err := backend.ParseDSN(d.dsn)
	if err != nil {
		return 0, err
	}
	switch {
	case isRedis(u):
		a, err := newRedisAdmin(d.dsn)
		if err != nil {
			return 0, err
		}
		defer a.Close()
		return a.permits(ctx, name)
	case u.Scheme == "etcd" || u.Scheme == "etcds":
		cli, prefix, err := etcd.Dial(ctx, d.dsn)
		if err != nil {
			return 0, err
		}
		defer cli.Close()
		resp, err := cli.Get(ctx, etcd.LockName(prefix, name+"/permits/"), clientv3.WithPrefix())
		if err != nil {
			return 0, backend.RedactError(err, u)
		}
		for _, kv := range resp.Kvs {
			if n, ok := semaphore.ParseLabel(string(kv.Value)); ok {
				return n, nil
			}
		}
	}
	return 0, nil
}

// rwView is the view of the read/write lock name in the portable layout
// (rwlock's NAME/write and read slots), where write, the state of
// NAME/write, or one of the read slots reads is held.
func rwView(name string, write dlock.LockInfo, reads []dlock.LockInfo) view {
	v := view{Key: name, Kind: kindRWLock, Held: true, Waiters: waitersOf(write.Waiters), Holders: []holder{}}
	switch {
	case write.Held && len(reads) == rwlock.Readers:
		v.Mode = "write"
		v.Holders = append(v.Holders, holderOf(write, "writer"))
	case write.Held:
		// A writer taking the read slots as the readers leave, or a reader
		// passing through the write lock.
		v.Mode = "write"
		v.Holders = append(v.Holders, holderOf(write, "writer"))
		v.Notes = append(v.Notes, fmt.Sprintf("%d of the %d read slots are held: readers, or the writer that waits for them to leave", len(reads), rwlock.Readers))
	default:
		v.Mode, v.Readers = "read", len(reads)
		for _, r := range reads {
			v.Holders = append(v.Holders, holderOf(r, "reader"))
		}
	}
	return v
}

// inspect returns the view of key: the lock key if held; else the
// semaphore key if one of its permits is held; else the read/write lock key
// in the portable layout if held; else the free lock key, with notes on
// what the backend could not tell.
func (d *describer) inspect(ctx context.Context, key string) (view, error) {
	info, err := dlock.Inspect(ctx, d.l, key)
	if err != nil {
		return view{}, err
	}
	v := lockView(info)
	if info.Held {
		if info.Shared == 0 && d.l.Capabilities().Shared {
			v.Notes = append(v.Notes, "held exclusively: by a lock's holder, or by a read/write lock's writer")
		}
		return v, nil
	}
	if semaphore.CheckName(key) != nil {
		return v, nil
	}
	// A semaphore: its slots, NAME/permits/I.
	slots, err := dlock.List(ctx, d.l, key+"/permits/")
	if errors.Is(err, errors.ErrUnsupported) {
		v.Notes = append(v.Notes, fmt.Sprintf("the backend cannot list its locks, so dlock cannot tell whether %q is a semaphore with permits held: inspect its slots, %s", key, semaphore.SlotKey(key, 0)+", …"))
		return v, nil
	}
	if err != nil {
		return view{}, err
	}
	if held := slotsOf(key, slots); len(held) > 0 {
		queue, err := dlock.Inspect(ctx, d.l, key+"/permits/queue")
		if err != nil {
			return view{}, err
		}
		return d.semaphoreView(ctx, key, held, queue), nil
	}
	// A read/write lock in the portable layout: NAME/write and
	// NAME/read/permits/I.
	write, err := dlock.Inspect(ctx, d.l, key+"/write")
	if err != nil {
		return view{}, err
	}
	reads, err := dlock.List(ctx, d.l, key+"/read/permits/")
	if err != nil {
		return view{}, err
	}
	if held := slotsOf(key+"/read", reads); write.Held || len(held) > 0 {
		return rwView(key, write, held), nil
	}
	return v, nil
}

// group returns the views of what infos (a List) hold: each lock, each
// semaphore (its slots grouped), each read/write lock (its write lock and
// read slots grouped), in key order.
func (d *describer) group(ctx context.Context, infos []dlock.LockInfo) []view {
	type rw struct {
		write dlock.LockInfo
		reads []dlock.LockInfo
	}
	sems := map[string][]dlock.LockInfo{}
	queues := map[string]dlock.LockInfo{}
	rws := map[string]*rw{}
	rwOf := func(name string) *rw {
		if rws[name] == nil {
			rws[name] = &rw{}
		}
		return rws[name]
	}
	var views []view
	for _, in := range infos {
		if i := strings.LastIndex(in.Key, "/permits/"); i > 0 {
			name := in.Key[:i]
			if _, ok := slotIndex(name, in.Key); ok {
				if rwName, ok := strings.CutSuffix(name, "/read"); ok {
					r := rwOf(rwName)
					r.reads = append(r.reads, in)
				} else {
					sems[name] = append(sems[name], in)
				}
				continue
			}
			if in.Key == name+"/permits/queue" {
				queues[name] = in
				continue
			}
		}
		if name, ok := strings.CutSuffix(in.Key, "/write"); ok && name != "" {
			rwOf(name).write = in
			continue
		}
		views = append(views, lockView(in))
	}
	for name, slots := range sems {
		views = append(views, d.semaphoreView(ctx, name, slotsOf(name, slots), queues[name]))
		delete(queues, name)
	}
	for _, q := range queues { // a queue lock without a permit held: a lock
		views = append(views, lockView(q))
	}
	for name, r := range rws {
		reads := slotsOf(name+"/read", r.reads)
		if len(reads) == 0 { // NAME/write alone: taken as a lock of its own
			views = append(views, lockView(r.write))
			continue
		}
		views = append(views, rwView(name, r.write, reads))
	}
	slices.SortFunc(views, func(a, b view) int { return strings.Compare(a.Key, b.Key) })
	return views
}
