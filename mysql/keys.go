package mysql

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxName is MySQL's limit on the length of a user-level lock name.
const maxName = 64

// LockName returns the GET_LOCK name of a dlock key in a namespace: the
// namespace, a colon, and the lowercase hex SHA-256 of (namespace, a NUL
// byte, key), cut to 64 characters (docs/mysql.md, Names, has it in SQL). The
// rule never changes, so that every version's locks exclude each other.
func LockName(namespace, key string) string {
	h := sha256.New()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	name := namespace + ":" + hex.EncodeToString(h.Sum(sum[:0]))
	return name[:min(len(name), maxName)]
}
