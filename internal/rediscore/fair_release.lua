-- fair_release: delete the lock if this owner holds it, and wake the next
-- waiter (the Redis driver's fair mode; see fair_acquire.lua). Also what a
-- waiter that gives up runs (ARGV[3] = '1'): it leaves the queue, and if the
-- lock is free, wakes the waiter now at its head.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  the queue               <prefix>{<tag>}:queue
-- KEYS[3]  the waiters' expiries   <prefix>{<tag>}:qexp
-- ARGV[1]  the owner id
-- ARGV[2]  the release channel     <prefix>{<tag>}:released
-- ARGV[3]  '1': leave the queue rather than release the lock
--
-- The message names the waiter at the head of the queue (its TTL not yet
-- passed), or is empty if none waits: waiters of other modes treat any
-- message as a wake-up.
--
-- Returns 1 if the lock was this owner's and is now deleted (or, leaving,
-- if the caller was queued), else 0.
if redis.replicate_commands then redis.replicate_commands() end

local done = 0
if ARGV[3] == '1' then
  done = redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return done
  end
elseif redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  done = 1
else
  return 0
end
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head = ''
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, 9)) do
  local exp = redis.call('ZSCORE', KEYS[3], w)
  if exp and tonumber(exp) > nowms then
    head = w
    break
  end
end
redis.call('PUBLISH', ARGV[2], head)
return done
