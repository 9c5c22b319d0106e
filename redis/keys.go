package redis

import (
	"fmt"
	"strings"
)

// tagEscaper percent-encodes the three bytes that would break a hash tag or
// the injectivity of the mapping: '%' itself, and the braces Redis Cluster
// reads as the tag's delimiters.
var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// HashTag returns the Redis Cluster hash tag of a dlock key: the key with '%',
// '{' and '}' percent-encoded as "%25", "%7B" and "%7D". For a non-empty key
// the tag is never empty and holds no brace, so Redis Cluster hashes exactly
// it, and two different keys never share a tag.
func HashTag(key string) string { return tagEscaper.Replace(key) }

// LockKey returns the Redis key that holds the lock on key: prefix followed by
// the key's hash tag in braces, "<prefix>{<tag>}" (see HashTag). Its value is
// the holder's owner id and its TTL is the lease's.
func LockKey(prefix, key string) string { return prefix + "{" + HashTag(key) + "}" }

// FenceKey returns the Redis key of key's fencing counter,
// "<prefix>{<tag>}:fence". It has no TTL. It shares the lock key's hash tag,
// so both live in one Redis Cluster slot.
func FenceKey(prefix, key string) string { return LockKey(prefix, key) + ":fence" }

// ReleaseChannel returns the pub/sub channel on which the driver announces
// that key was released, "<prefix>{<tag>}:released".
func ReleaseChannel(prefix, key string) string { return LockKey(prefix, key) + ":released" }

// keys are the Redis names of one dlock key.
type keys struct {
	lock, fence, channel string
}

func keysFor(prefix, key string) *keys {
	lock := LockKey(prefix, key)
	return &keys{lock: lock, fence: lock + ":fence", channel: lock + ":released"}
}

// checkPrefix reports why prefix cannot prefix the driver's keys.
func checkPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("prefix %q contains '{' or '}': Redis Cluster would take the hash tag from the prefix", prefix)
	}
	return nil
}
