-- semaphore: one call on a counted semaphore of the Redis driver
-- (backend.AcquireRequest.Permits): acquire, extend, release or relabel a
-- permit. Every key shares the semaphore's hash tag, so Redis Cluster keeps
-- them in one slot.
--
-- KEYS[1]  the permits   <prefix>{<tag>}:permits          zset: slot → expiry (server ms)
-- KEYS[2]  the holders   <prefix>{<tag>}:permits:holders  hash: slot → "<token> <owner>[ <label>]"
-- KEYS[3]  the size      <prefix>{<tag>}:permits:size     string: n, the number of permits
-- KEYS[4]  the counter   <prefix>{<tag>}:permits:fence    string: the last token (no TTL)
-- ARGV[1]  the operation: 'acquire', 'extend', 'release' or 'relabel'
-- ARGV[2]  the holder: the owner id, and its label after a space
-- ARGV[3]  the channel   <prefix>{<tag>}:permits:released (a release and
--          a sweep that freed permits publish '' on it)
--
-- acquire  ARGV[4] the TTL in ms, ARGV[5] n.
--          Returns {1, token, slot} when granted, {0, pttl} when all n
--          are held (pttl: ms until the first holder's expiry), {-1, m}
--          when the holders use m permits, not n. A holder that already holds a permit (the
--          client retried a request whose reply was lost) gets its slot
--          again, with a new expiry and a new token.
-- extend   ARGV[4] the slot, ARGV[5] the token, ARGV[6] the TTL in ms.
--          Returns 1 if the permit was the holder's and is extended, else 0.
-- release  ARGV[4] the slot, ARGV[5] the token ('' for any slot and token:
--          the clean-up after a reply that was lost). Returns 1 if the
--          permit was the holder's and is now free, else 0.
-- relabel  ARGV[4] the slot, ARGV[5] the token, ARGV[6] the new holder.
--          Returns 1 if the permit was the holder's and is relabelled.
--
-- First, every script sweeps: the permits whose expiry has passed (on the
-- server's clock) are removed, so the permit of a holder that vanished
-- returns once its expiry passes, and never before. The three keys expire
-- at the last permit's expiry, and are deleted with the last permit: a
-- semaphore nobody holds leaves only its counter.

-- TIME is non-deterministic; Redis before 5 replicates scripts verbatim unless
-- told to replicate their effects. A no-op on Redis 7.
if redis.replicate_commands then redis.replicate_commands() end

local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = math.floor(nowus / 1000)
local op, holder, channel = ARGV[1], ARGV[2], ARGV[3]

local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nowms)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowms)
  for _, slot in ipairs(gone) do
    redis.call('HDEL', KEYS[2], slot)
  end
  redis.call('PUBLISH', channel, '')
end

-- settle deletes the semaphore once nobody holds a permit, and otherwise
-- makes its keys expire with its last permit.
local function settle()
  local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    return
  end
  for i = 1, 3 do
    redis.call('PEXPIREAT', KEYS[i], last[2])
  end
end

if op == 'acquire' then
  local ttl, n = tonumber(ARGV[4]), tonumber(ARGV[5])
  local count = redis.call('ZCARD', KEYS[1])
  if count == 0 then
    -- Nobody holds a permit: the size is this caller's, and a holder left
    -- in the hash without an expiry (a key deleted behind our back) is gone.
    redis.call('DEL', KEYS[2], KEYS[3])
  else
    local size = tonumber(redis.call('GET', KEYS[3]) or '')
    if size and size ~= n then
      return {-1, size}
    end
  end
  local vals = redis.call('HGETALL', KEYS[2])
  local taken, slot = {}, nil
  for i = 1, #vals, 2 do
    taken[vals[i]] = true
    local v = vals[i + 1]
    local sp = string.find(v, ' ', 1, true)
    if sp and string.sub(v, sp + 1) == holder then
      slot = vals[i]
    end
  end
  if not slot then
    if count >= n then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      return {0, tonumber(first[2]) - nowms}
    end
    -- The lowest slot no holder has: at most count+1 tries.
    for i = 0, n - 1 do
      if not taken[tostring(i)] then
        slot = tostring(i)
        break
      end
    end
    if not slot then
      return redis.error_reply('every slot is taken although fewer permits are held')
    end
  end
  -- The token is the counter, floored at the server's clock in µs, as for
  -- a lock (acquire.lua): a counter lost to a restart without persistence,
  -- an eviction or a FLUSH cannot send tokens backwards.
  local token = redis.call('INCR', KEYS[4])
  if token < nowus then
    token = nowus
    redis.call('SET', KEYS[4], string.format('%.0f', nowus))
  end
  redis.call('ZADD', KEYS[1], nowms + ttl, slot)
  redis.call('HSET', KEYS[2], slot, string.format('%.0f', token) .. ' ' .. holder)
  redis.call('SET', KEYS[3], n)
  settle()
  return {1, token, tonumber(slot)}
end

local slot = ARGV[4]
if op == 'extend' then
  if redis.call('HGET', KEYS[2], slot) ~= ARGV[5] .. ' ' .. holder then
    return 0
  end
  redis.call('ZADD', KEYS[1], nowms + tonumber(ARGV[6]), slot)
  settle()
  return 1
end

if op == 'relabel' then
  if redis.call('HGET', KEYS[2], slot) ~= ARGV[5] .. ' ' .. holder then
    return 0
  end
  redis.call('HSET', KEYS[2], slot, ARGV[5] .. ' ' .. ARGV[6])
  return 1
end

if op == 'release' then
  if ARGV[5] == '' then
    -- Any slot of this holder's (one at most: owner ids are unique).
    slot = nil
    local vals = redis.call('HGETALL', KEYS[2])
    for i = 1, #vals, 2 do
      local v = vals[i + 1]
      local sp = string.find(v, ' ', 1, true)
      if sp and string.sub(v, sp + 1) == holder then
        slot = vals[i]
      end
    end
  elseif redis.call('HGET', KEYS[2], slot) ~= ARGV[5] .. ' ' .. holder then
    slot = nil
  end
  if not slot then
    settle()
    return 0
  end
  redis.call('HDEL', KEYS[2], slot)
  redis.call('ZREM', KEYS[1], slot)
  settle()
  redis.call('PUBLISH', channel, '')
  return 1
end

return redis.error_reply('semaphore: unknown operation ' .. tostring(op))
