package mysql

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxName is MySQL's limit on the length of a user-level lock name.
const maxName = 64

// LockName returns the GET_LOCK name of a dlock key in a namespace: the
// namespace, a colon, and the lowercase hex SHA-256 of (namespace, a NUL
// byte, key), cut to MySQL's 64 characters. The same in SQL:
//
//	SELECT LEFT(CONCAT(ns, ':', SHA2(CONCAT(ns, CHAR(0), k), 256)), 64)
//
// The namespace is at most 32 bytes (so at least 31 hex digits, 124 bits of
// the hash, remain); neither it nor the key contains a NUL byte, so the
// input names the pair unambiguously. Hex digits have no case, so the
// server's comparison of names (case-insensitive in MySQL 5.7 and later)
// cannot merge two names. The rule will not change: locks taken by
// different versions must exclude each other.
func LockName(namespace, key string) string {
	h := sha256.New()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	name := namespace + ":" + hex.EncodeToString(h.Sum(sum[:0]))
	return name[:min(len(name), maxName)]
}
