package redlock

import "github.com/dlock-go/dlock/internal/rediscore"

// LockKey returns the Redis key that holds the lock on key on every node,
// "<prefix>{<tag>}", where the tag is key with '%', '{' and '}'
// percent-encoded. Its value is the holder's owner id and its TTL is the
// lease's. The layout is the single-Redis driver's.
func LockKey(prefix, key string) string { return rediscore.LockKey(prefix, key) }

// FenceKey returns the Redis key of key's fencing counter on every node,
// "<prefix>{<tag>}:fence". It has no TTL.
func FenceKey(prefix, key string) string { return rediscore.FenceKey(prefix, key) }

// ReleaseChannel returns the pub/sub channel on which every node announces
// that key was released there, "<prefix>{<tag>}:released".
func ReleaseChannel(prefix, key string) string { return rediscore.ReleaseChannel(prefix, key) }
