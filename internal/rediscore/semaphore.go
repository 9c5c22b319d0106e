package rediscore

import (
	_ "embed"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

//go:embed semaphore.lua
var semaphoreSrc string

// Semaphore runs one operation on a counted semaphore of package redis
// (backend.AcquireRequest.Permits): 'acquire', 'extend', 'release' or
// 'relabel' a permit, after sweeping the permits whose expiry has passed.
// KEYS: SemKeys.Keys. ARGV: operation, holder, channel, then the
// operation's own; semaphore.lua documents them and the replies.
var Semaphore = goredis.NewScript(semaphoreSrc)

// SemKeys are the Redis names of a counted semaphore: every one has the
// hash tag of the semaphore's dlock key, so Redis Cluster keeps them in one
// slot, and none ends in '}', so none is a lock key.
type SemKeys struct {
	Permits string // zset: slot → expiry (server ms)
	Holders string // hash: slot → "<token> <owner>[ <label>]"
	Size    string // string: the number of permits the holders use
	Fence   string // string: the last token; no TTL
	Channel string // pub/sub: '' on each release and sweep that frees permits
}

// SemKeysFor returns the names of the counted semaphore key under prefix:
// "<prefix>{<tag>}:permits", and its ":holders", ":size", ":fence" and
// ":released" after that.
func SemKeysFor(prefix, key string) *SemKeys {
	p := LockKey(prefix, key) + ":permits"
	return &SemKeys{Permits: p, Holders: p + ":holders", Size: p + ":size", Fence: p + ":fence", Channel: p + ":released"}
}

// Keys returns the script's KEYS.
func (k *SemKeys) Keys() []string { return []string{k.Permits, k.Holders, k.Size, k.Fence} }

// SemHoldersSuffix ends the name of every semaphore's holders hash.
const SemHoldersSuffix = "}:permits:holders"

// SemKeyOf returns the dlock key of a semaphore's holders hash under prefix
// (a name that SemKeysFor returns as Holders), and whether name is one.
func SemKeyOf(prefix, name string) (string, bool) {
	lock, ok := strings.CutSuffix(name, SemHoldersSuffix[1:])
	if !ok {
		return "", false
	}
	return KeyOf(prefix, lock)
}

// SplitPermitKey splits a permit's key, backend.PermitKey(key, slot) =
// key + "/permits/" + slot, into the semaphore's key and the slot; ok is
// false for any other key (the slot written otherwise than strconv.Itoa
// writes it, or the key empty).
func SplitPermitKey(permit string) (key string, slot int, ok bool) {
	i := strings.LastIndex(permit, "/permits/")
	if i <= 0 {
		return "", 0, false
	}
	s := permit[i+len("/permits/"):]
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return "", 0, false
	}
	return permit[:i], n, true
}

// ParsePermitHolder splits a value of a semaphore's holders hash into the
// permit's token and its holder (owner id and label, as HolderValue).
func ParsePermitHolder(v string) (token uint64, holder string, ok bool) {
	t, holder, ok := strings.Cut(v, " ")
	if !ok {
		return 0, "", false
	}
	token, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return token, holder, true
}

// SemRead reads the live permits of a counted semaphore, writing nothing:
// KEYS: holders, permits. ARGV: a slot, or ” for every slot. Reply: a flat
// list of slot, holders-hash value and ms until its expiry, for each permit
// whose expiry (server time) has not passed.
var SemRead = goredis.NewScript(`
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local function add(slot, v)
  if not v then return end
  local s = redis.call('ZSCORE', KEYS[2], slot)
  if s and tonumber(s) > nowms then
    out[#out + 1] = slot
    out[#out + 1] = v
    out[#out + 1] = string.format('%.0f', tonumber(s) - nowms)
  end
end
if ARGV[1] ~= '' then
  add(ARGV[1], redis.call('HGET', KEYS[1], ARGV[1]))
else
  local vals = redis.call('HGETALL', KEYS[1])
  for i = 1, #vals, 2 do
    add(vals[i], vals[i + 1])
  end
end
return out`)
