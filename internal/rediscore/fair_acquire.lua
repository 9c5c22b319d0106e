-- fair_acquire: take the lock in FIFO order (the Redis driver's fair mode).
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  the fencing counter     <prefix>{<tag>}:fence
-- KEYS[3]  the queue               <prefix>{<tag>}:queue   zset: waiter → arrival number
-- KEYS[4]  the waiters' expiries   <prefix>{<tag>}:qexp    zset: waiter → expiry (server ms)
-- KEYS[5]  the arrival counter     <prefix>{<tag>}:qseq
-- KEYS[6]  the waiters' records    <prefix>{<tag>}:qwait   hash: waiter → "<ttl ms> <channel>"
-- ARGV[1]  the owner id (the lock's value; a waiter's name in the queue)
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  '1': join (or stay in) the queue if not granted; '0': a try
-- ARGV[4]  the waiter's own TTL in milliseconds: it is dropped from the
--          queue unless it calls again within it
-- ARGV[5]  the release channel     <prefix>{<tag>}:released, on which a
--          grant is announced with the message "+" (for followers)
-- ARGV[6]  with ARGV[3] '1': the waiter's wake-up channel, one per client
--          (<prefix>waiters:<id>), on which the lock is handed to it or it
--          is named when it heads the queue of a free lock
-- KEYS[7]  optional: the shared holders <prefix>{<tag>}:readers: while one
--          is live (a client of the default mode holds the key shared; fair
--          mode takes no shared holds) the lock is not granted
--
-- The lock is granted when it is free and the caller heads the queue (or the
-- queue is empty). Waiters whose TTL has passed are dropped first, so a
-- crashed waiter holds the queue up for at most its TTL. If the lock is free
-- but another waiter heads the queue, the head is named on its wake-up
-- channel (its message may have been lost, or the waiter before it dropped).
-- A waiter records the lease TTL it asks for and its channel (KEYS[6]): a
-- release hands the lock to the head of the queue with that TTL
-- (fair_release.lua), and the head's next call finds the lock its own and is
-- granted again (its hand-off message may have been lost).
--
-- Returns {1, token} when granted, else {0, pttl, rank, now}: the holder's
-- remaining TTL in ms (-1 if none or not held), the caller's place in the
-- queue (0 = next; -1 if not queued), and the server's time in µs (a waiter
-- handed the lock later counts its lease from a call that ran before the
-- hand-off, which it tells by this time).

if redis.replicate_commands then redis.replicate_commands() end

local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = math.floor(nowus / 1000)

-- Waiters whose TTL passed leave the queue first. An empty queue (nobody
-- waits: the uncontended acquire) has none: the queue, the expiries and the
-- records gain and lose a waiter together.
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head then
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', nowms)
  for i = 1, #dead, 500 do
    local part = {unpack(dead, i, math.min(i + 499, #dead))}
    redis.call('ZREM', KEYS[4], unpack(part))
    redis.call('ZREM', KEYS[3], unpack(part))
    redis.call('HDEL', KEYS[6], unpack(part))
  end
  if #dead > 0 then
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
end

local holder = redis.call('GET', KEYS[1])
-- readers: how long until the first live shared holder's expiry, if any.
local readers = nil
if KEYS[7] and redis.call('EXISTS', KEYS[7]) == 1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', string.format('%.0f', nowms))
  local first = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
  if first[1] then readers = math.max(0, tonumber(first[2]) - nowms) end
end

-- dequeue takes the caller out of the queue, its expiry and its record.
local function dequeue()
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
end

-- grant draws the new holder's token and announces the grant; queued: the caller may be in
-- the queue (it is not if the queue was empty).
local function grant(queued)
  if queued then dequeue() end
  -- As in acquire.lua: the counter, floored at the server's clock in µs.
  local token = redis.call('INCR', KEYS[2])
  if token < nowus then
    token = nowus
    redis.call('SET', KEYS[2], string.format('%.0f', nowus))
  end
  redis.call('PUBLISH', ARGV[5], '+') -- for followers; waiters ignore it
  return {1, token}
end

if holder == ARGV[1] then
  -- A retry of a grant whose reply was lost, or a hand-off whose message
  -- was lost or is still on its way: the same grant, with a new TTL. Its
  -- token is the counter's value, which no grant has moved since (the lock
  -- is this owner's); a second token, announced to followers, would make
  -- one grant look like two.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  dequeue()
  local token = tonumber(redis.call('GET', KEYS[2]) or '')
  if token then
    return {1, token}
  end
  return grant(false) -- the counter is gone: a new token, floored at the clock
end
if not holder and not readers and (head == nil or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return grant(head ~= nil)
end

if ARGV[3] == '1' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), ARGV[1])
    if not head then head = ARGV[1] end
  end
  local wttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[4], nowms + wttl, ARGV[1])
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[2] .. ' ' .. ARGV[6])
  -- The queue's keys outlive their last waiter by a little, then go.
  for i = 3, 6 do redis.call('PEXPIRE', KEYS[i], 2 * wttl) end
end
if not holder and not readers and head and head ~= ARGV[1] then
  local rec = redis.call('HGET', KEYS[6], head)
  local ch = rec and string.match(rec, '^%d+ (.+)$')
  redis.call('PUBLISH', ch or ARGV[5], head)
end
local rank = redis.call('ZRANK', KEYS[3], ARGV[1])
if not rank then rank = -1 end
local pttl = -1
if holder then pttl = redis.call('PTTL', KEYS[1]) elseif readers then pttl = readers end
return {0, pttl, rank, nowus}
