-- shared: a lock's shared holds (AcquireRequest.Shared) and its waiting
-- writers' marks, beside the exclusive lock (acquire.lua, release.lua).
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  the fencing counter     <prefix>{<tag>}:fence
-- KEYS[3]  the shared holders      <prefix>{<tag>}:readers  zset: holder → expiry (server ms)
-- KEYS[4]  the waiting writers     <prefix>{<tag>}:writers  zset: writer → expiry (server ms)
-- ARGV[1]  the operation: acquire, extend, release, relabel, leave or break
-- ARGV[2]  the holder's value (owner id and label; a writer's for leave)
-- ARGV[3]  acquire, extend: the TTL in ms; relabel: the new value
-- ARGV[4]  the release channel     <prefix>{<tag>}:released
--
-- Every call first sweeps both sets: entries whose expiry has passed on the
-- server's clock go (and "*", which wakes every waiter, is published if that
-- emptied a set). A shared grant is refused while the lock key exists or a
-- writer waits (a live mark): writers are preferred.
--
-- acquire: {1, token} when granted (the token is the key's counter, bumped
--          and floored at the server's clock in µs, as acquire.lua's), else
--          {0, pttl}: how long until the exclusive holder's TTL or the
--          first writer's mark runs out, in ms (-1: unknown).
-- extend:  1 if the holder is still one (its expiry reset), else 0.
-- release: 1 if it was a holder (now gone), else 0; "*" is published when
--          the last holder leaves (waiting writers try again).
-- relabel: 1 if the holder is one under either value (now the new), else 0.
-- leave:   a waiting writer gives up: its mark goes, and "*" is published.
-- break:   every shared holder goes; returns how many there were.

if redis.replicate_commands then redis.replicate_commands() end

local op, holder = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- sweep removes key's expired entries; true if that left none.
local function sweep(key)
  return redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', nowms)) > 0
    and redis.call('EXISTS', key) == 0
end
-- keep makes key expire with its last entry.
local function keep(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[1] then
    redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - nowms))
  end
end

local emptied = sweep(KEYS[3])
if sweep(KEYS[4]) then emptied = true end
if emptied then redis.call('PUBLISH', ARGV[4], '*') end

if op == 'acquire' then
  -- A holder already (a retried request whose reply was lost): granted again.
  if not redis.call('ZSCORE', KEYS[3], holder) then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      return {0, redis.call('PTTL', KEYS[1])}
    end
    local w = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    if w[1] then
      return {0, math.max(0, tonumber(w[2]) - nowms)}
    end
  end
  redis.call('ZADD', KEYS[3], string.format('%.0f', nowms + tonumber(ARGV[3])), holder)
  keep(KEYS[3])
  local token = redis.call('INCR', KEYS[2])
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if token < now then
    token = now
    redis.call('SET', KEYS[2], string.format('%.0f', now))
  end
  redis.call('PUBLISH', ARGV[4], '+')
  return {1, token}
elseif op == 'extend' then
  if not redis.call('ZSCORE', KEYS[3], holder) then
    return 0
  end
  redis.call('ZADD', KEYS[3], 'XX', string.format('%.0f', nowms + tonumber(ARGV[3])), holder)
  keep(KEYS[3])
  return 1
elseif op == 'release' then
  if redis.call('ZREM', KEYS[3], holder) == 0 then
    return 0
  end
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('PUBLISH', ARGV[4], '*')
  end
  return 1
elseif op == 'relabel' then
  if redis.call('ZSCORE', KEYS[3], ARGV[3]) then
    return 1
  end
  local s = redis.call('ZSCORE', KEYS[3], holder)
  if not s then
    return 0
  end
  redis.call('ZREM', KEYS[3], holder)
  redis.call('ZADD', KEYS[3], s, ARGV[3])
  redis.call('PUBLISH', ARGV[4], '+')
  return 1
elseif op == 'leave' then
  if redis.call('ZREM', KEYS[4], holder) == 1 then
    redis.call('PUBLISH', ARGV[4], '*')
  end
  return 1
elseif op == 'break' then
  local n = redis.call('ZCARD', KEYS[3])
  if n > 0 then
    redis.call('DEL', KEYS[3])
    redis.call('PUBLISH', ARGV[4], '*')
  end
  return n
end
return redis.error_reply('shared: unknown operation ' .. tostring(op))
