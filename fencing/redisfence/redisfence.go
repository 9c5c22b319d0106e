// Package redisfence fences writes to Redis by dlock's tokens: each write runs
// in one Lua script that compares the token with the resource's fence key,
// advances the fence and writes. A script runs atomically in Redis (no other
// command runs between its first and last call), so the check and the write
// are one step. Like fencing.Guard, a token equal to or above the fence is
// accepted and a lower one, or 0, is rejected with a *fencing.StaleTokenError.
//
// The fence of resource R is the key Prefix+"{R}" and every data key of R
// must carry the hash tag {R} (see Key), so that on Redis Cluster the fence
// and the data are in one slot, as a script needs. The fence key has no TTL;
// deleting it forgets every token seen for R. docs/guards.md has the pattern.
package redisfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// DefaultPrefix is Guard.Prefix's default.
const DefaultPrefix = "dlock:fence:"

// ErrBadKey is matched (errors.Is) by the error of a write whose resource is
// empty or contains a brace, or whose data key does not carry the resource's
// hash tag.
var ErrBadKey = errors.New("redisfence: bad resource or key")

// Key returns the data key name of resource, "{resource}name": a key that
// carries the resource's hash tag.
func Key(resource, name string) string { return "{" + resource + "}" + name }

// Guard runs fenced writes on a Redis server or cluster. It holds no state
// and is safe for concurrent use; Client is required.
type Guard struct {
	// Client runs the scripts: a *redis.Client, *redis.ClusterClient or
	// any redis.Scripter. Required.
	Client goredis.Scripter

	// Prefix is prepended to "{resource}" to name a resource's fence key. It
	// must not contain a brace. Default DefaultPrefix.
	Prefix string

	// OnReject, if set, is called with every rejection of a stale token:
	// count it (package dlockotel's RejectionCounter) or log it. It must not
	// block.
	OnReject func(*fencing.StaleTokenError)
}

// staleReply is the error reply of a script that found a higher fence,
// followed by that fence.
const staleReply = "DLOCKSTALE "

// fenceLua checks ARGV[1] (the token, in decimal) against the fence in
// KEYS[1], comparing decimal strings exactly (Lua's numbers are doubles), and
// sets the fence; a lower token returns an error reply naming the fence.
const fenceLua = `local tok = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and (#cur > #tok or (#cur == #tok and cur > tok)) then
  return redis.error_reply('` + staleReply + `' .. cur)
end
redis.call('SET', KEYS[1], tok)
`

var (
	setScript = goredis.NewScript(fenceLua + `if ARGV[3] ~= '0' then
  return redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return redis.call('SET', KEYS[2], ARGV[2])`)
	hsetScript = goredis.NewScript(fenceLua + `return redis.call('HSET', KEYS[2], unpack(ARGV, 2))`)
	delScript  = goredis.NewScript(fenceLua + `return redis.call('DEL', unpack(KEYS, 2))`)
	getScript  = goredis.NewScript(`return redis.call('GET', KEYS[1])`)
)

// Set runs SET key value [PX ttl] (no expiry if ttl is 0; a negative ttl is
// an error) if token is current for resource, in one script with the check.
func (g *Guard) Set(ctx context.Context, token dlock.Token, resource, key string, value any, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("redisfence: Set %q: negative ttl %v", key, ttl)
	}
	ms := ttl.Milliseconds()
	if ttl > 0 && ms == 0 {
		ms = 1
	}
	_, err := g.run(ctx, "SET", setScript, token, resource, []string{key}, value, ms)
	return err
}

// HSet runs HSET key field value [field value ...] if token is current for
// resource, in one script with the check; values are field-value pairs.
func (g *Guard) HSet(ctx context.Context, token dlock.Token, resource, key string, values ...any) error {
	if len(values) == 0 || len(values)%2 != 0 {
		return fmt.Errorf("redisfence: HSet %q: want field-value pairs, got %d values", key, len(values))
	}
	_, err := g.run(ctx, "HSET", hsetScript, token, resource, []string{key}, values...)
	return err
}

// Del runs DEL on keys if token is current for resource, in one script with
// the check, and returns how many keys it deleted. The fence stays.
func (g *Guard) Del(ctx context.Context, token dlock.Token, resource string, keys ...string) (int64, error) {
	if len(keys) == 0 {
		return 0, fmt.Errorf("%w: Del of %q names no key", ErrBadKey, resource)
	}
	res, err := g.run(ctx, "DEL", delScript, token, resource, keys)
	if err != nil {
		return 0, err
	}
	n, _ := res.(int64)
	return n, nil
}

// Script is a Lua script of the user's that Guard.Run runs only while the
// token is current, as the body of the script that checks it. Safe for
// concurrent use.
type Script struct {
	s *goredis.Script
}

// NewScript returns src as a fenced script. src is written as for EVAL: it
// sees its own keys and arguments as KEYS and ARGV (without the fence's) and
// returns a value; every key it touches must be among its keys.
func NewScript(src string) *Script {
	return &Script{s: goredis.NewScript(fenceLua +
		"local function body(KEYS, ARGV)\n" + src +
		"\nend\nreturn body({unpack(KEYS, 2)}, {unpack(ARGV, 2)})")}
}

// Run runs s with keys and args if token is current for resource, in one
// script with the check, and returns its result (nil for a nil reply). If
// the script fails after writing, Redis keeps its writes and the fence is
// advanced.
func (g *Guard) Run(ctx context.Context, token dlock.Token, resource string, s *Script, keys []string, args ...any) (any, error) {
	res, err := g.run(ctx, "script", s.s, token, resource, keys, args...)
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return res, err
}

// Highest returns the highest token accepted for resource (0 if none).
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Token, error) {
	fk, err := g.fenceKey(resource)
	if err != nil {
		return 0, err
	}
	if g.Client == nil {
		return 0, errors.New("redisfence: Guard.Client is nil")
	}
	v, err := getScript.Run(ctx, g.Client, []string{fk}).Text()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redisfence: read the fence of %q: %w", resource, err)
	}
	tok, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redisfence: the fence of %q is not a token: %w", resource, err)
	}
	return dlock.Token(tok), nil
}

func (g *Guard) fenceKey(resource string) (string, error) {
	prefix := g.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if resource == "" || strings.ContainsAny(resource, "{}") || strings.ContainsAny(prefix, "{}") {
		return "", fmt.Errorf("%w: resource %q, prefix %q: want a non-empty resource and neither with a brace", ErrBadKey, resource, prefix)
	}
	return prefix + "{" + resource + "}", nil
}

// run checks the keys, then runs s with the fence key and token first.
func (g *Guard) run(ctx context.Context, op string, s *goredis.Script, token dlock.Token, resource string, keys []string, args ...any) (any, error) {
	fk, err := g.fenceKey(resource)
	if err != nil {
		return nil, err
	}
	tag := "{" + resource + "}"
	for _, k := range keys {
		if hashTag(k) != resource {
			return nil, fmt.Errorf("%w: key %q of resource %q lacks the hash tag %s (see Key)", ErrBadKey, k, resource, tag)
		}
	}
	if token == 0 {
		return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token})
	}
	if g.Client == nil {
		return nil, errors.New("redisfence: Guard.Client is nil")
	}
	res, err := s.Run(ctx, g.Client, append([]string{fk}, keys...),
		append([]any{strconv.FormatUint(uint64(token), 10)}, args...)...).Result()
	if err == nil || errors.Is(err, goredis.Nil) {
		return res, err
	}
	if msg, ok := strings.CutPrefix(err.Error(), staleReply); ok {
		hi, perr := strconv.ParseUint(msg, 10, 64)
		if perr == nil {
			return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token, Highest: dlock.Token(hi)})
		}
	}
	return nil, fmt.Errorf("redisfence: fenced %s on %q: %w", op, resource, err)
}

func (g *Guard) reject(e *fencing.StaleTokenError) error {
	if g.OnReject != nil {
		g.OnReject(e)
	}
	return e
}

// hashTag returns the part of key Redis Cluster hashes: between the first
// '{' and the next '}', if that is not empty; else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}
