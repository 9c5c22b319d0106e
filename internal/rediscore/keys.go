package rediscore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/dlock-go/dlock/backend"
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

// LockKey returns "<prefix>{<tag>}", the Redis key that holds the lock on key.
func LockKey(prefix, key string) string { return prefix + "{" + HashTag(key) + "}" }

// FenceKey returns "<prefix>{<tag>}:fence", the key of key's fencing counter.
func FenceKey(prefix, key string) string { return LockKey(prefix, key) + ":fence" }

// ReleaseChannel returns "<prefix>{<tag>}:released", the pub/sub channel
// announcing that key was released.
func ReleaseChannel(prefix, key string) string { return LockKey(prefix, key) + ":released" }

// WaiterChannel returns "<prefix>waiters:<id>", the pub/sub channel of one
// client's fair-mode waiters (package redis, Options.Fair): a release that
// hands the lock to one of them, or names it, publishes there.
func WaiterChannel(prefix, id string) string { return prefix + "waiters:" + id }

// Keys are the Redis names of one dlock key. A held lease keeps its Keys, so
// the fair mode's names are made when needed (Queue, QueueExpiry, QueueSeq,
// QueueWait).
type Keys struct {
	Lock, Fence, Channel string
}

// KeysFor returns the names of key under prefix.
func KeysFor(prefix, key string) *Keys {
	lock := LockKey(prefix, key)
	return &Keys{Lock: lock, Fence: lock + ":fence", Channel: lock + ":released"}
}

// Readers is the shared holders of the lock, a sorted set of holder →
// expiry (server ms) (package redis, AcquireRequest.Shared).
func (k *Keys) Readers() string { return k.Lock + ":readers" }

// Writers is the waiting writers' marks, a sorted set of writer → expiry
// (server ms): while one is live, shared acquires are refused.
func (k *Keys) Writers() string { return k.Lock + ":writers" }

// Queue is the fair mode's queue of waiters, in arrival order (package
// redis, Options.Fair).
func (k *Keys) Queue() string { return k.Lock + ":queue" }

// QueueExpiry is the fair mode's waiters' expiries.
func (k *Keys) QueueExpiry() string { return k.Lock + ":qexp" }

// QueueSeq is the fair mode's arrival counter.
func (k *Keys) QueueSeq() string { return k.Lock + ":qseq" }

// QueueWait is the fair mode's record of each waiter's lease TTL (ms) and
// wake-up channel, "<ttl> <channel>": a release that hands the lock to the
// head of the queue sets that TTL and tells that channel.
func (k *Keys) QueueWait() string { return k.Lock + ":qwait" }

// SharedKeys are the KEYS of shared.lua, and of acquire.lua where it looks
// at shared holders (the default mode): the lock, its counter, Readers and
// Writers.
func (k *Keys) SharedKeys() []string {
	return []string{k.Lock, k.Fence, k.Readers(), k.Writers()}
}

// FairAcquireKeys are the KEYS of fair_acquire.lua.
func (k *Keys) FairAcquireKeys() []string {
	return []string{k.Lock, k.Fence, k.Queue(), k.QueueExpiry(), k.QueueSeq(), k.QueueWait(), k.Readers()}
}

// FairReleaseKeys are the KEYS of fair_release.lua.
func (k *Keys) FairReleaseKeys() []string {
	return []string{k.Lock, k.Queue(), k.QueueExpiry(), k.Fence, k.QueueWait(), k.Readers()}
}

// CheckPrefix reports why prefix cannot prefix the drivers' keys.
func CheckPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("prefix %q contains '{' or '}': Redis Cluster would take the hash tag from the prefix", prefix)
	}
	return nil
}

// HolderValue is the value of a held lock key: the owner ID, and the
// holder's label after a space if it has one. The scripts compare the whole
// value, so it stands for the owner.
func HolderValue(owner, label string) string {
	if label == "" {
		return owner
	}
	return owner + " " + label
}

// SplitHolder splits a lock key's value into owner ID and label.
func SplitHolder(v string) (owner, label string) {
	owner, label, _ = strings.Cut(v, " ")
	return owner, label
}

// KeyOf returns the dlock key of a lock key under prefix, and whether name
// is one ("<prefix>{<tag>}", with no suffix).
func KeyOf(prefix, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"{")
	if !ok || !strings.HasSuffix(rest, "}") {
		return "", false
	}
	tag := rest[:len(rest)-1]
	if strings.ContainsAny(tag, "{}") {
		return "", false
	}
	return tagUnescaper.Replace(tag), true
}

var tagUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// GlobEscape escapes the characters SCAN's MATCH pattern reads as special.
func GlobEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// LockPattern is the SCAN MATCH pattern of the lock keys under prefix whose
// keys start with keyPrefix.
func LockPattern(prefix, keyPrefix string) string {
	return GlobEscape(prefix+"{"+HashTag(keyPrefix)) + "*}"
}

// HeldLocks reads, with inspect, the locks of the lock keys among names
// (Redis key names under prefix) whose dlock keys start with keyPrefix, and
// returns the held ones in key order.
func HeldLocks(ctx context.Context, prefix, keyPrefix string, names []string,
	inspect func(ctx context.Context, key string) (backend.LockInfo, error)) ([]backend.LockInfo, error) {
	var infos []backend.LockInfo
	for _, name := range names {
		key, ok := KeyOf(prefix, name)
		if !ok || !strings.HasPrefix(key, keyPrefix) {
			continue
		}
		info, err := inspect(ctx, key)
		if err != nil {
			return nil, err
		}
		if info.Held {
			infos = append(infos, info)
		}
	}
	slices.SortFunc(infos, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return infos, nil
}
