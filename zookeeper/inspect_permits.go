// Inspecting and breaking a counted semaphore's permits by their slot keys.

package zookeeper

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
)

// permitKey splits a slot key, NAME/permits/i (backend.PermitKey), into the
// semaphore's key and the slot.
func permitKey(key string) (sem string, slot int, ok bool) {
	j := strings.LastIndex(key, "/permits/")
	if j <= 0 {
		return "", 0, false
	}
	i, err := strconv.Atoi(key[j+len("/permits/"):])
	if err != nil || i < 0 || strconv.Itoa(i) != key[j+len("/permits/"):] {
		return "", 0, false
	}
	return key[:j], i, true
}

// readPermits reads the lease nodes of the counted semaphore sem (Curator's
// layout, see semaphore.go) and returns the LockInfo of each slot a dlock
// lease node holds, by slot, with the node's path; waiting counts dlock's
// lease nodes that hold no slot yet. Curator's own lease nodes hold no slot
// and are not listed. No leases node: nothing held.
func (d *Driver) readPermits(sem string) (held map[int]backend.LockInfo, paths map[int]string, waiting int, err error) {
	leases := LockPath(d.root, sem) + "/" + semLeases
	children, _, err := d.conn.Children(leases)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil, 0, nil
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list %s: %w", leases, err)
	}
	held, paths = map[int]backend.LockInfo{}, map[int]string{}
	for _, c := range children {
		path := leases + "/" + c
		data, st, err := d.conn.Get(path)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released since the listing
		}
		if err != nil {
			return nil, nil, 0, fmt.Errorf("read %s: %w", path, err)
		}
		slot, _, ok := parsePermitData(data)
		switch {
		case !ok:
			continue // Curator's
		case slot < 0:
			waiting++
			continue
		}
		held[slot] = backend.LockInfo{
			Key:   backend.PermitKey(sem, slot),
			Held:  true,
			Token: uint64(st.Czxid),
			Label: permitLabel(data),
			Owner: ownerOf(c),
		}
		paths[slot] = path
	}
	return held, paths, waiting, nil
}

// permitLabel is the label in a dlock lease node's data ("slot=<i>
// permits=<n> <label>").
func permitLabel(data []byte) string {
	s := string(data)
	for _, field := range []string{"slot=", "permits="} {
		if rest, ok := strings.CutPrefix(s, field); ok {
			_, s, _ = strings.Cut(rest, " ")
		}
	}
	return s
}

// inspectPermit is inspect for a slot key whose lock node nobody holds: the
// dlock lease node of the semaphore that holds the slot, if any, with its
// path.
func (d *Driver) inspectPermit(key string) (backend.LockInfo, string, error) {
	info := backend.LockInfo{Key: key}
	sem, slot, ok := permitKey(key)
	if !ok {
		return info, "", nil
	}
	held, paths, waiting, err := d.readPermits(sem)
	if err != nil {
		return info, "", err
	}
	h, ok := held[slot]
	if !ok {
		return info, "", nil
	}
	h.Waiters = waiting
	return h, paths[slot], nil
}

// listPermits appends to infos the slots held in the semaphore sem whose
// keys start with prefix.
func (d *Driver) listPermits(infos []backend.LockInfo, sem, prefix string) ([]backend.LockInfo, error) {
	held, _, waiting, err := d.readPermits(sem)
	if err != nil {
		return infos, err
	}
	for _, info := range held {
		if strings.HasPrefix(info.Key, prefix) {
			info.Waiters = waiting
			infos = append(infos, info)
		}
	}
	return infos, nil
}
