-- fair_release: delete the lock if this owner holds it, and hand it to the
-- next waiter (the Redis driver's fair mode; see fair_acquire.lua). Also what
-- a waiter that gives up runs (ARGV[3] = '1'): it leaves the queue, and if
-- the lock is free, or was handed to it meanwhile, passes it on the same way.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  the queue               <prefix>{<tag>}:queue
-- KEYS[3]  the waiters' expiries   <prefix>{<tag>}:qexp
-- KEYS[4]  the fencing counter     <prefix>{<tag>}:fence
-- KEYS[5]  the waiters' records    <prefix>{<tag>}:qwait   hash: waiter → "<ttl ms> <channel>"
-- KEYS[6]  optional: the shared holders <prefix>{<tag>}:readers: while one
--          is live (a client of the default mode), the lock is not handed
--          over; the head is named instead, and takes it when it can
-- ARGV[1]  the owner id
-- ARGV[2]  the release channel     <prefix>{<tag>}:released
-- ARGV[3]  '1': leave the queue rather than release the lock
-- ARGV[4]  '1': hand the lock to the head of the queue; '0': only name the
--          head on the channel, which then takes the lock with its own
--          acquire (a driver whose grants must be acknowledged by replicas,
--          which only the grantee's own request can wait for)
--
-- The head is the first waiter whose TTL has not passed. Handed the lock,
-- it becomes the holder at once, with the lease TTL it asked for and the
-- next token, and the message "!<token> <now> <head>" on its wake-up channel
-- tells it so (now: the server's time in µs); it needs no request of its
-- own, and no other waiting client hears of it. Followers hear "+" on the
-- release channel, as for any grant. Otherwise the head is named on its
-- wake-up channel, or, if none waits, the release channel gets an empty
-- message (waiters of the default mode treat any message but "+" as a
-- wake-up).
--
-- Returns 1 if the lock was this owner's and is now released (or, leaving,
-- if the caller was queued or handed the lock), else 0.
if redis.replicate_commands then redis.replicate_commands() end

-- dequeue takes waiter w out of the queue, its expiry and its record, and
-- returns whether it was queued.
local function dequeue(w)
  local queued = redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
  redis.call('HDEL', KEYS[5], w)
  return queued
end

local done = 0
if ARGV[3] == '1' then
  done = dequeue(ARGV[1])
  local holder = redis.call('GET', KEYS[1])
  if holder == ARGV[1] then
    -- Handed the lock as it gave up: pass it on.
    redis.call('DEL', KEYS[1])
    done = 1
  elseif holder then
    return done
  end
elseif redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  done = 1
else
  return 0
end
local head = ''
local queued = redis.call('ZRANGE', KEYS[2], 0, 9)
local nowus, nowms = 0, 0
if #queued > 0 then -- the clock is needed only if someone waits
  local t = redis.call('TIME')
  nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
  nowms = math.floor(nowus / 1000)
end
for _, w in ipairs(queued) do
  local exp = redis.call('ZSCORE', KEYS[3], w)
  if exp and tonumber(exp) > nowms then
    head = w
    break
  end
end
local ttl, ch = nil, nil
if head ~= '' then
  local rec = redis.call('HGET', KEYS[5], head)
  if rec then ttl, ch = string.match(rec, '^(%d+) (.+)$') end
end
if not ch then
  redis.call('PUBLISH', ARGV[2], head)
  return done
end
local shared = KEYS[6] and redis.call('ZCOUNT', KEYS[6], string.format('%.0f', nowms + 1), '+inf') > 0
if ARGV[4] ~= '1' or shared then
  redis.call('PUBLISH', ch, head)
  return done
end
redis.call('SET', KEYS[1], head, 'PX', ttl)
dequeue(head)
-- As in acquire.lua: the counter, floored at the server's clock in µs.
local token = redis.call('INCR', KEYS[4])
if token < nowus then
  token = nowus
  redis.call('SET', KEYS[4], string.format('%.0f', nowus))
end
redis.call('PUBLISH', ch, '!' .. string.format('%.0f', token) .. ' ' .. string.format('%.0f', nowus) .. ' ' .. head)
redis.call('PUBLISH', ARGV[2], '+')
return done
