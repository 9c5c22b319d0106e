// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// Inspect implements backend.Inspector after a sync, so it sees every change
// committed before the call; Expires and Granted are zero, and a semaphore's
// slot key, NAME/permits/i, reports the lease node that holds slot i.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	info, _, err := d.inspect(ctx, key)
	return info, err
}

// inspect reads key's lock and returns it with the holders' node paths (in
// queue order; the one LockInfo describes last).
func (d *Driver) inspect(ctx context.Context, key string) (backend.LockInfo, []string, error) {
	// A server reads from its own copy, which may lag the leader: a lock
	// granted a moment ago through another server would read as free. The
	// sync brings this client's server up to the leader first.
	if _, err := d.sharedSync(ctx); err != nil {
		return backend.LockInfo{Key: key}, nil, fmt.Errorf("sync: %w", err)
	}
	info, paths, _, err := d.readHolder(ctx, key)
	if err != nil || info.Held {
		return info, paths, err
	}
	// A slot key of a counted semaphore (NAME/permits/i) is held by a lease
	// node of the semaphore, not by a lock node of its own.
	pinfo, path, err := d.inspectPermit(key)
	if err != nil || !pinfo.Held {
		return info, nil, err
	}
	return pinfo, []string{path}, nil
}

// readHolder is inspect without the sync. sem reports, when nobody holds
// key, whether its node is a counted semaphore's (it has Curator's leases
// node under it).
func (d *Driver) readHolder(ctx context.Context, key string) (info backend.LockInfo, paths []string, sem bool, err error) {
	info = backend.LockInfo{Key: key}
	parent := LockPath(d.root, key)
	for range 3 { // the holder may go between the listing and the read
		if err := ctx.Err(); err != nil {
			return info, nil, false, err
		}
		children, st, err := d.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return info, nil, false, nil
		}
		if err != nil {
			return info, nil, false, fmt.Errorf("list %s: %w", parent, d.refused(err, parent))
		}
		locks := sortedLocks(children, st.Cversion)
		h := holders(locks)
		if h == 0 {
			return info, nil, slices.Contains(children, semLeases), nil
		}
		last := locks[h-1] // the holder granted last
		path := parent + "/" + last
		data, nst, err := d.conn.Get(path)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return info, nil, false, fmt.Errorf("read %s: %w", path, d.refused(err, path))
		}
		info.Held = true
		if isShared(last) {
			info.Shared = h
		}
		info.Token = uint64(nst.Czxid)
		info.Label = string(data)
		info.Owner = ownerOf(last)
		info.Waiters = len(locks) - h
		paths = make([]string, h)
		for i, c := range locks[:h] {
			paths[i] = parent + "/" + c
		}
		return info, paths, false, nil
	}
	return info, nil, false, fmt.Errorf("read the holder of %s: it changed three times in a row", parent)
}

// ownerOf returns the owner ID (32 hex digits) in a protected lock node's
// name, or "" for a node of another kind.
func ownerOf(child string) string {
	rest, ok := strings.CutPrefix(child, protectedPrefix)
	if !ok || len(rest) < 36 {
		return ""
	}
	id := strings.ReplaceAll(rest[:36], "-", "")
	if len(id) != 32 || !isHex(id) {
		return ""
	}
	return id
}

// List implements backend.Inspector over the key nodes under the root and
// the counted semaphores' held slots.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if _, err := d.sharedSync(ctx); err != nil { // as in inspect
		return nil, fmt.Errorf("sync: %w", err)
	}
	names, _, err := d.conn.Children(d.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.root, d.refused(err, d.root))
	}
	esc := EscapeKey(prefix)
	if prefix == "" {
		esc = ""
	}
	var infos []backend.LockInfo
	for _, name := range names {
		key, err := unescapeKey(name)
		if err != nil {
			continue // not a node of dlock's layout
		}
		if !strings.HasPrefix(name, esc) {
			if sp := key + "/permits/"; strings.HasPrefix(sp, prefix) || strings.HasPrefix(prefix, sp) {
				// The slot keys of a counted semaphore key are
				// key/permits/i: some may start with prefix.
				if infos, err = d.listPermits(infos, key, prefix); err != nil {
					return nil, err
				}
			}
			continue
		}
		info, _, sem, err := d.readHolder(ctx, key)
		if err != nil {
			return nil, err
		}
		if info.Held {
			infos = append(infos, info)
		} else if sem { // a counted semaphore's node holds no lock
			if infos, err = d.listPermits(infos, key, prefix); err != nil {
				return nil, err
			}
		}
	}
	slices.SortFunc(infos, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return infos, nil
}

// unescapeKey inverts EscapeKey (percent-encoding).
func unescapeKey(name string) (string, error) { return url.PathUnescape(name) }

// Break implements backend.Breaker: it deletes the holder's node it read
// (every shared holder's; a slot's lease node), keeping the key's node, so
// the next grant's token is higher.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	info, paths, err := d.inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	deleted := 0
	for _, path := range paths {
		err := d.conn.Delete(path, -1)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, zk.ErrNoNode): // went on its own meanwhile
		default:
			return info, fmt.Errorf("delete %s: %w", path, d.refused(err, parentOf(path)))
		}
	}
	if deleted == 0 {
		return info, fmt.Errorf("key %q: its holder went before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}
