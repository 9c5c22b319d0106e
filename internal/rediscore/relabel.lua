-- relabel: change the lock's value (the holder's owner ID and label, see
-- HolderValue) if this owner holds it, keeping its TTL, and announce the
-- change on the release channel as a grant is announced ("+": waiters ignore
-- it; followers read the new value).
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- ARGV[1]  the current value (owner ID and label)
-- ARGV[2]  the new value (the same owner ID, the new label)
-- ARGV[3]  the release channel     <prefix>{<tag>}:released
--
-- Returns 1 if the lock was this owner's (with either value: a retried
-- request whose reply was lost) and now has the new value, else 0.
if redis.replicate_commands then redis.replicate_commands() end

local v = redis.call('GET', KEYS[1])
if v == ARGV[2] then
  return 1
end
if v ~= ARGV[1] then
  return 0
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', pttl)
else
  redis.call('SET', KEYS[1], ARGV[2])
end
redis.call('PUBLISH', ARGV[3], '+')
return 1
