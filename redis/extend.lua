-- extend: reset the lock's TTL if this owner holds it.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL in milliseconds
--
-- Returns 1 if the lock was this owner's and is extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
