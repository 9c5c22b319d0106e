package redis

import "github.com/dlock-go/dlock/internal/rediscore"

// HashTag returns the Redis Cluster hash tag of a dlock key: the key with '%',
// '{' and '}' percent-encoded, never empty, and different for different keys.
func HashTag(key string) string { return rediscore.HashTag(key) }

// LockKey returns the Redis key that holds the lock on key: prefix followed by
// the key's hash tag in braces, "<prefix>{<tag>}" (see HashTag). Its value is
// the holder's owner id and its TTL is the lease's.
func LockKey(prefix, key string) string { return rediscore.LockKey(prefix, key) }

// FenceKey returns the Redis key of key's fencing counter,
// "<prefix>{<tag>}:fence". It has no TTL. It shares the lock key's hash tag,
// so both live in one Redis Cluster slot.
func FenceKey(prefix, key string) string { return rediscore.FenceKey(prefix, key) }

// ReleaseChannel returns the pub/sub channel on which the driver announces
// that key was released, "<prefix>{<tag>}:released".
func ReleaseChannel(prefix, key string) string { return rediscore.ReleaseChannel(prefix, key) }

// PermitsKey returns the sorted set of the counted semaphore key,
// "<prefix>{<tag>}:permits": slot → expiry (ms, server clock). Its other keys
// add ":holders", ":size" and ":fence" to it, its channel ":released".
func PermitsKey(prefix, key string) string { return rediscore.SemKeysFor(prefix, key).Permits }

// PermitHoldersKey returns the hash of the counted semaphore key's holders,
// "<prefix>{<tag>}:permits:holders": slot → "<token> <owner id>[ <label>]".
func PermitHoldersKey(prefix, key string) string { return rediscore.SemKeysFor(prefix, key).Holders }
