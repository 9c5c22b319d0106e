-- acquire: take the lock if it is free and bump the key's fencing counter.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  the fencing counter     <prefix>{<tag>}:fence   (same hash tag)
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  optional: "holder" makes a refusal also name the holder (Redlock
--          uses it to tell one holder with a quorum from a split vote); any
--          other value does not
-- ARGV[4]  optional: the release channel, on which a grant is announced with
--          the message "+" (waiters ignore it; followers, backend.Watcher,
--          read the new holder)
-- KEYS[3]  optional: the shared holders <prefix>{<tag>}:readers (shared.lua),
--          zset: holder → expiry (server ms). With it, the lock is refused
--          while a shared holder's expiry has not passed (the expired ones
--          are swept). Without it (Redlock), shared holds are not looked at.
-- KEYS[4]  with KEYS[3]: the waiting writers <prefix>{<tag>}:writers,
--          zset: writer → expiry (server ms)
-- ARGV[5]  with KEYS[3]: "" or a waiting writer's mark TTL in ms: a refused
--          caller records (or renews) its mark in KEYS[4], which keeps
--          shared acquires out until it expires or the caller is granted
-- ARGV[6]  with KEYS[3]: "1" if the caller may have a mark: a grant removes it
--
-- Returns {1, token} when granted, {0, pttl} when another owner holds the lock
-- (pttl: the holder's remaining time to live in ms, -1 if the key has none;
-- with shared holders, the time until the first one's expiry),
-- or {0, pttl, holder} with ARGV[3].

-- TIME is non-deterministic; Redis before 5 replicates scripts verbatim unless
-- told to replicate their effects. A no-op on Redis 7.
if redis.replicate_commands then redis.replicate_commands() end

-- mark records the caller as a waiting writer (KEYS[4], ARGV[5]).
local function mark()
  if ARGV[5] == nil or ARGV[5] == '' then
    return
  end
  local t = redis.call('TIME')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[4], string.format('%.0f', nowms + tonumber(ARGV[5])), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[4], math.max(1, tonumber(last[2]) - nowms))
end

-- The default path's one extra command: is the key held shared?
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', nowms))
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[1] then
    mark()
    return {0, math.max(0, tonumber(first[2]) - nowms)}
  end
end

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] then
    if ARGV[3] == 'holder' then
      return {0, redis.call('PTTL', KEYS[1]), holder or ''}
    end
    if KEYS[3] then
      mark()
    end
    return {0, redis.call('PTTL', KEYS[1])}
  end
  -- This owner holds the lock already: the client retried a request whose
  -- reply was lost. Grant it again, with a new TTL and a new token.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end

-- The token is the counter, floored at the server's clock in microseconds, so
-- that a counter lost to a restart without persistence, an eviction or a
-- FLUSH cannot send tokens backwards as long as the clock does not step back.
local token = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if token < now then
  token = now
  -- ~1.7e15 < 2^53: exact as a Lua number. '%.0f', not tostring, which would
  -- give "1.7e+15".
  redis.call('SET', KEYS[2], string.format('%.0f', now))
end
if KEYS[3] and ARGV[6] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if ARGV[4] then
  redis.call('PUBLISH', ARGV[4], '+')
end
return {1, token}
