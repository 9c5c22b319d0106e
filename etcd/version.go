// Detecting etcd servers before 3.5, whose watches need a second look.

package etcd

import (
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Values of Driver.watchGen.
const (
	watchUnknown   = iota
	watchDetecting // asking the members for their versions
	watchLegacy    // some member runs etcd < 3.5, or did not answer: waiters open a second watch
	watchModern    // every member runs etcd 3.5 or later
)

// legacyWatch reports whether a member of the cluster may run etcd before
// 3.5 (see awaitDeletion). The first call starts asking every endpoint in the
// background; until every one has answered 3.5 or later, the answer is yes.
func (d *Driver) legacyWatch() bool {
	switch d.watchGen.Load() {
	case watchModern:
		return false
	case watchUnknown:
		if d.watchGen.CompareAndSwap(watchUnknown, watchDetecting) {
			d.mu.Lock()
			if d.closed {
				d.mu.Unlock()
				return true
			}
			d.wg.Add(1)
			d.mu.Unlock()
			go d.detectVersion()
		}
	}
	return true
}

// detectVersion sets watchGen from the versions the endpoints report.
func (d *Driver) detectVersion() {
	defer d.wg.Done()
	eps := d.cli.Endpoints()
	old := make([]bool, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			ctx, cancel := d.reqCtx(d.bg)
			defer cancel()
			st, err := d.cli.Status(ctx, ep)
			old[i] = err != nil || versionBefore(st.Version, 3, 5)
		})
	}
	wg.Wait()
	if slices.Contains(old, true) {
		d.watchGen.Store(watchLegacy)
	} else {
		d.watchGen.Store(watchModern)
	}
}

// versionBefore reports whether the version v ("3.4.23") is before
// major.minor, or does not parse.
func versionBefore(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < major || ma == major && mi < minor
}
