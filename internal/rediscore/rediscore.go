// Package rediscore is what dlock's two Redis drivers share: the Lua scripts
// that take, extend and release a lock on one Redis server, the key layout
// those scripts work on, the pub/sub connection that wakes waiters, and the
// helpers that keep passwords out of errors.
//
// Package redis runs the scripts against one server (or one Redis Cluster);
// package redlock runs the same scripts against each of N independent servers
// and counts a quorum. Keeping them here means both drivers lay out keys the
// same way and one fix reaches both.
package rediscore

import (
	"context"
	_ "embed"
	"errors"
	"net"

	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed fair_acquire.lua
	fairAcquireSrc string
	//go:embed fair_release.lua
	fairReleaseSrc string
	//go:embed shared.lua
	sharedSrc string
	//go:embed relabel.lua
	relabelSrc string
)

// The scripts. Run sends EVALSHA and falls back to EVAL when the server
// answers NOSCRIPT (first use, restart, SCRIPT FLUSH). Each file documents its
// KEYS, ARGV and reply.
var (
	// Acquire takes the lock if it is free (or already this owner's) and bumps
	// the fencing counter, floored at the server's clock in µs.
	// KEYS: lock, fence [, readers, writers]. ARGV: owner, TTL in ms [,
	// "holder", channel, mark TTL in ms, "1" if marked]. With readers it
	// refuses while the key is held shared, and a refused waiting writer
	// marks itself (see acquire.lua). Reply: {1, token} or {0, pttl}.
	Acquire = goredis.NewScript(acquireSrc)

	// Shared runs one operation on a lock's shared holds and its waiting
	// writers' marks. KEYS: lock, fence, readers, writers. ARGV: operation
	// (acquire, extend, release, relabel, leave, break), holder, TTL in ms or
	// new value, channel. See shared.lua for the replies.
	Shared = goredis.NewScript(sharedSrc)

	// Release deletes the lock if it is this owner's and publishes on the
	// release channel. KEYS: lock [, fence]. ARGV: owner, channel [, token].
	// Reply: 1 if deleted, else 0.
	Release = goredis.NewScript(releaseSrc)

	// Extend resets the lock's TTL if it is this owner's. KEYS: lock [, fence].
	// ARGV: owner, TTL in ms [, token]. Reply: 1 if extended, else 0.
	Extend = goredis.NewScript(extendSrc)

	// FairAcquire is Acquire in FIFO order, with a queue of waiters whose
	// entries expire unless renewed. KEYS: lock, fence, queue, qexp, qseq,
	// qwait. ARGV: owner, TTL in ms, join ('1') or try ('0'), waiter TTL in
	// ms, channel, the waiter's wake-up channel. Reply: {1, token} or {0,
	// pttl, rank, server time in µs}.
	FairAcquire = goredis.NewScript(fairAcquireSrc)

	// FairRelease deletes the lock if it is this owner's (or, with ARGV[3]
	// '1', takes the caller out of the queue, releasing the lock if it was
	// handed to the caller meanwhile) and hands it to the head of the queue
	// (ARGV[4] '1', announced on the head's wake-up channel as ParseHandoff
	// reads it) or names the head there. KEYS: lock, queue, qexp, fence,
	// qwait. ARGV: owner, channel, leave, hand off. Reply: 1 if released (or
	// dequeued), else 0.
	FairRelease = goredis.NewScript(fairReleaseSrc)

	// Relabel changes the lock's value (owner and label) if it is this
	// owner's, keeping its TTL, and announces it. KEYS: lock. ARGV: current
	// value, new value, channel. Reply: 1 if changed (or already the new
	// value), else 0.
	Relabel = goredis.NewScript(relabelSrc)

	// Break deletes the lock key if its value is still the holder's that
	// the caller read, and announces the release to waiters; the fencing
	// counter stays, so the next grant's token is higher. KEYS: lock.
	// ARGV: value, channel. Reply: 1 if deleted.
	Break = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0`)
)

// MayHaveRun reports whether a failed command may still have reached the
// server: anything but a failure to connect or a closed client.
func MayHaveRun(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return !errors.Is(err, goredis.ErrClosed)
}

// Ping checks that the server answers, within ctx: go-redis bounds a command
// by ctx's deadline but does not notice a cancellation while it waits for a
// reply, so on cancellation Ping closes client to end the call.
func Ping(ctx context.Context, client goredis.UniversalClient) error {
	done := make(chan error, 1)
	go func() { done <- client.Ping(ctx).Err() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = client.Close() // ends the ping
		<-done
		return ctx.Err()
	}
}
