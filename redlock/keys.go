package redlock

import "github.com/dlock-go/dlock/internal/rediscore"

// LockKey returns the Redis key that holds the lock on key on every node,
// "<prefix>{<tag>}", as in the single-Redis driver's layout.
func LockKey(prefix, key string) string { return rediscore.LockKey(prefix, key) }

// FenceKey returns the Redis key of key's fencing counter on every node,
// "<prefix>{<tag>}:fence". It has no TTL.
func FenceKey(prefix, key string) string { return rediscore.FenceKey(prefix, key) }

// ReleaseChannel returns the pub/sub channel on which every node announces
// that key was released there, "<prefix>{<tag>}:released".
func ReleaseChannel(prefix, key string) string { return rediscore.ReleaseChannel(prefix, key) }
