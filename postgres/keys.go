package postgres

import (
	"crypto/sha256"
	"encoding/binary"
)

// AdvisoryKey is the PostgreSQL advisory lock a dlock key maps to
// (Options.AdvisoryKey computes one; docs/postgres.md, Keys, has the rule).
type AdvisoryKey struct {
	// Int4Pair selects the two-int4 form pg_advisory_lock(Key1, Key2); when
	// false the lock is the int8 form pg_advisory_lock(Int8). The two forms
	// are separate lock spaces in PostgreSQL: they never collide.
	Int4Pair bool

	// Int8 is the key of the int8 form: HashKey(namespace, key).
	Int8 int64

	// Key1 is the class id of the two-int4 form (Options.ClassID), and Key2 the
	// first 32 bits of HashKey(namespace, key).
	Key1, Key2 int32
}

// PgLocks returns the pg_locks columns classid, objid and objsubid that
// identify this lock in rows with locktype 'advisory'.
func (k AdvisoryKey) PgLocks() (classid, objid uint32, objsubid int16) {
	if k.Int4Pair {
		return uint32(k.Key1), uint32(k.Key2), 2
	}
	return uint32(uint64(k.Int8) >> 32), uint32(uint64(k.Int8)), 1
}

// args returns the arguments of pg_advisory_lock and its relatives.
func (k AdvisoryKey) args() []any {
	if k.Int4Pair {
		return []any{k.Key1, k.Key2}
	}
	return []any{k.Int8}
}

// HashKey returns the 64-bit advisory key of a dlock key in a namespace: the
// first 8 bytes of SHA-256(namespace, a NUL byte, key) as a big-endian signed
// integer (docs/postgres.md, Keys, has it in SQL). The rule never changes, so
// that every version's locks exclude each other.
func HashKey(namespace, key string) int64 {
	h := sha256.New()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}
