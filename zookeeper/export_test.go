package zookeeper

import "time"

// Test hooks for the tests of package zookeeper_test. They work on drivers
// that own their connection (Dial, dlock.Open).

// Sever makes d's process vanish as far as the servers can tell: its
// connection drops and it cannot connect again, without closing its session or
// deleting a node. The servers expire the session after its timeout.
func Sever(d *Driver) {
	BlockDial(d)
	d.wireMu.Lock()
	w := d.wire
	d.wireMu.Unlock()
	if w != nil {
		_ = w.Conn.Close()
	}
}

// BlockDial keeps d from opening new connections (its current one stays up).
func BlockDial(d *Driver) {
	d.wireMu.Lock()
	d.severed = true
	d.wireMu.Unlock()
}

// UnblockDial undoes BlockDial and Sever.
func UnblockDial(d *Driver) {
	d.wireMu.Lock()
	d.severed = false
	d.wireMu.Unlock()
}

// Session returns the id and password of d's latest session.
func Session(d *Driver) (int64, []byte) {
	h := d.lastHandshake()
	return h.id, h.passwd
}

// DropNextCreateReply makes d's connection break when the server answers the
// next lock-node create, after the server applied it: the client sees a
// connection loss, and does not know whether the node was created.
func DropNextCreateReply(d *Driver) {
	d.wireMu.Lock()
	d.dropOp = opMulti
	d.wireMu.Unlock()
}

// DropArmed reports whether DropNextCreateReply's hook has not fired yet.
func DropArmed(d *Driver) bool {
	d.wireMu.Lock()
	defer d.wireMu.Unlock()
	return d.dropOp != 0
}

// SortedLocks returns the lock nodes among children in queue order.
var SortedLocks = sortedLocks

// Holders counts the lock nodes (in queue order) that hold the lock: the
// first if it is exclusive, else the shared nodes before the first exclusive
// one.
var Holders = holders

// Opcodes of the requests RecordOps sees.
const (
	OpExists       = 3
	OpGetData      = 4
	OpDelete       = 2
	OpSync         = 9
	OpGetChildren2 = 12
	OpMulti        = opMulti
)

// RecordOps starts recording the opcodes of the requests d sends (pings
// excepted); SentOps returns them and starts over.
func RecordOps(d *Driver) {
	d.wireMu.Lock()
	d.recordOps, d.sentOps = true, nil
	d.wireMu.Unlock()
}

// SentOps returns the opcodes recorded since RecordOps or the last SentOps.
func SentOps(d *Driver) []int32 {
	d.wireMu.Lock()
	defer d.wireMu.Unlock()
	ops := d.sentOps
	d.sentOps = nil
	return ops
}

// LastAck returns when (a reading of the driver's suspend-aware clock) the
// leader last confirmed d's current session alive, as the session-loss rule
// counts it.
func LastAck(d *Driver) time.Duration {
	c := d.sess.current()
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastAck
}

// Bounce breaks d's current connection without blocking the next one: the
// client reconnects at once and resumes its session.
func Bounce(d *Driver) {
	d.wireMu.Lock()
	w := d.wire
	d.wireMu.Unlock()
	if w != nil {
		_ = w.Conn.Close()
	}
}

// BreakOnWrite makes d's connection break as the next request with opcode op
// is written: go-zookeeper's write fails, and the server never sees it.
func BreakOnWrite(d *Driver, op int32) {
	d.wireMu.Lock()
	d.breakOp = op
	d.wireMu.Unlock()
}

// PermitData and ParsePermitData are permitData and parsePermitData.
var (
	PermitData      = permitData
	ParsePermitData = parsePermitData
)
