package zookeeper

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Node names, in the layout of Apache Curator's InterProcessMutex with
// protection (CreateBuilder.withProtection): a lock is an ephemeral sequential
// child "_c_<uuid>-lock-<sequence>" of the key's node, so Curator clients and
// dlock exclude each other when they use the same path. A shared hold
// (AcquireRequest.Shared: package rwlock's readers) is a child "_c_<uuid>-read-lock-<sequence>": its name
// still ends in "lock-<sequence>", so Curator's InterProcessMutex and
// go-zookeeper's zk.Lock, which order children by what follows the last
// "lock-", queue it as one more exclusive holder or waiter.
const (
	protectedPrefix = "_c_"
	lockName        = "lock-"
	readTag         = "read-" // before lockName in a shared node's name
	uuidLen         = 36      // 8-4-4-4-12
)

// EscapeKey returns the single ZooKeeper node name that stands for a dlock
// key, different for different keys: '%', '/', every character ZooKeeper
// forbids in a path or Java sees as a surrogate pair, and invalid UTF-8 are
// percent-encoded byte by byte, and "." and ".." become "%2E" and "%2E%2E"
// ("jobs/nightly" becomes "jobs%2Fnightly").
func EscapeKey(key string) string {
	if key == "." || key == ".." {
		return strings.Repeat("%2E", len(key))
	}
	var b strings.Builder
	b.Grow(len(key))
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		if mustEscape(r, size) {
			for _, c := range []byte(key[i : i+size]) {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		} else {
			b.WriteString(key[i : i+size])
		}
		i += size
	}
	return b.String()
}

func mustEscape(r rune, size int) bool {
	switch {
	case r == utf8.RuneError && size <= 1: // invalid UTF-8
		return true
	case r == '%', r == '/':
		return true
	case r <= 0x1F, r >= 0x7F && r <= 0x9F:
		return true
	case r >= 0xD800 && r <= 0xF8FF:
		return true
	case r >= 0xFFF0: // includes every rune above U+FFFF
		return true
	}
	return false
}

// LockPath returns the path of the node under which the locks of key queue:
// root + "/" + EscapeKey(key). Its children are the holder's and the waiters'
// ephemeral sequential nodes.
func LockPath(root, key string) string {
	return root + "/" + EscapeKey(key)
}

// checkRoot validates the root path every lock lives under.
func checkRoot(root string) error {
	if !strings.HasPrefix(root, "/") {
		return fmt.Errorf("root %q: must be an absolute path such as %q", root, DefaultRoot)
	}
	if root == "/" {
		return fmt.Errorf("root %q: locks cannot live in the root of the tree, next to /zookeeper; use a path such as %q", root, DefaultRoot)
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return fmt.Errorf("root %q: /zookeeper is ZooKeeper's own subtree", root)
	}
	for _, part := range strings.Split(root[1:], "/") {
		switch {
		case part == "":
			return fmt.Errorf("root %q: empty path component", root)
		case part == "." || part == "..":
			return fmt.Errorf("root %q: relative path component %q", root, part)
		}
		for i := 0; i < len(part); {
			r, size := utf8.DecodeRuneInString(part[i:])
			if r != '%' && mustEscape(r, size) {
				return fmt.Errorf("root %q: character %q is not allowed in a ZooKeeper path", root, part[i:i+size])
			}
			i += size
		}
	}
	return nil
}

// protectedID returns the uuid that names an owner's lock node: the owner id
// (32 hex digits from backend.NewOwnerID) written as a UUID, 8-4-4-4-12, the
// form Curator's protected mode uses. Any other owner string is hashed first.
func protectedID(owner string) string {
	h := strings.ToLower(owner)
	if len(h) != 32 || !isHex(h) {
		sum := sha256.Sum256([]byte(owner))
		h = hex.EncodeToString(sum[:16])
	}
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// nodePrefix is the name a lock node is created with, shared or not; the
// server appends a 10-digit sequence number.
func nodePrefix(uuid string, shared bool) string {
	if shared {
		return protectedPrefix + uuid + "-" + readTag + lockName
	}
	return protectedPrefix + uuid + "-" + lockName
}

// isShared reports whether child is a shared lock node of dlock's:
// "_c_<uuid>-read-lock-<sequence>". Every other lock node, dlock's exclusive
// ones and every foreign one (Curator's, zk.Lock's), excludes all others.
func isShared(child string) bool {
	rest, ok := strings.CutPrefix(child, protectedPrefix)
	if !ok || len(rest) < uuidLen {
		return false
	}
	return strings.HasPrefix(rest[uuidLen:], "-"+readTag+lockName)
}

// holders returns how many of locks, in queue order, hold the lock: the
// first alone if it is exclusive, else every shared node before the first
// exclusive one. It is 0 only when locks is empty.
func holders(locks []string) int {
	if len(locks) == 0 {
		return 0
	}
	if !isShared(locks[0]) {
		return 1
	}
	n := 1
	for n < len(locks) && isShared(locks[n]) {
		n++
	}
	return n
}

// blocker returns the index in locks (queue order) of the node that a
// request at index i waits for, or -1 if it holds the lock: for an exclusive
// request the node just before it, for a shared one the nearest exclusive
// node before it.
func blocker(locks []string, i int, shared bool) int {
	if !shared {
		return i - 1
	}
	for j := i - 1; j >= 0; j-- {
		if !isShared(locks[j]) {
			return j
		}
	}
	return -1
}

// sequence returns the part of a child's name that orders it in the queue:
// what follows the last "lock-", as Curator's StandardLockInternalsDriver
// sorts. ok is false for a child that is not a lock node.
func sequence(child string) (seq string, ok bool) {
	i := strings.LastIndex(child, lockName)
	if i < 0 {
		return "", false
	}
	return child[i+len(lockName):], true
}

// sortedLocks returns the lock nodes among children in queue order (arrival
// order), given cversion, the parent's child version read with the same
// listing.
//
// A sequential node's suffix is the parent's cversion when it was created: a
// signed 32-bit count of the parent's child creates and deletes, printed
// "%010d". It wraps from 2147483647 to -2147483648, and a key node that never
// empties (a leader key with pollers) gets there after 2^31 creates and
// deletes. Neither comparing the suffixes as text (a "-" sorts first, and
// among negatives a newer node sorts first) nor as numbers orders nodes made
// on both sides of the wrap. The age of a node, cversion - suffix in 32-bit
// unsigned arithmetic, does: it counts the child changes since the node was
// made, and the oldest node holds the lock. This is exact while no node in
// the queue has lived through 2^32 child changes of its key; before any wrap
// it is the same order as Curator's and go-zookeeper's (ascending suffix). A
// name whose suffix is not a number sorts first: a node the driver cannot
// order is taken to be ahead of it, never behind.
func sortedLocks(children []string, cversion int32) []string {
	type node struct {
		name string
		age  uint64 // child changes since it was made; foreign names: above any age
	}
	nodes := make([]node, 0, len(children))
	for _, c := range children {
		seq, ok := sequence(c)
		if !ok {
			continue
		}
		age := uint64(math.MaxUint32) + 1
		if n, err := strconv.ParseInt(seq, 10, 32); err == nil {
			age = uint64(uint32(cversion) - uint32(int32(n)))
		}
		nodes = append(nodes, node{c, age})
	}
	slices.SortStableFunc(nodes, func(a, b node) int {
		if c := cmp.Compare(b.age, a.age); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	locks := make([]string, len(nodes))
	for i, n := range nodes {
		locks[i] = n.name
	}
	return locks
}

// ownChild returns the child created with prefix (our protected name), if any.
func ownChild(children []string, prefix string) (string, bool) {
	for _, c := range children {
		if strings.HasPrefix(c, prefix) {
			return c, true
		}
	}
	return "", false
}

var errNoLockNode = errors.New("the lock node is gone")
