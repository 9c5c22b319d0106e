package redis

import "github.com/dlock-go/dlock/internal/rediscore"

// HashTag returns the Redis Cluster hash tag of a dlock key: the key with '%',
// '{' and '}' percent-encoded as "%25", "%7B" and "%7D". For a non-empty key
// the tag is never empty and holds no brace, so Redis Cluster hashes exactly
// it, and two different keys never share a tag.
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

// PermitsKey returns the sorted set of the counted semaphore key
// (AcquireRequest.Permits): "<prefix>{<tag>}:permits", each held slot scored by
// its expiry in ms on the server's clock. The semaphore's other keys add a
// suffix to it: PermitHoldersKey, ":size" (the number of permits its
// holders use) and ":fence" (its fencing counter, no TTL); its channel is
// ":released". All share key's hash tag.
func PermitsKey(prefix, key string) string { return rediscore.SemKeysFor(prefix, key).Permits }

// PermitHoldersKey returns the hash of the counted semaphore key's holders,
// "<prefix>{<tag>}:permits:holders": slot → "<token> <owner id>[ <label>]".
func PermitHoldersKey(prefix, key string) string { return rediscore.SemKeysFor(prefix, key).Holders }
