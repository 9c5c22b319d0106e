-- release: delete the lock if this owner holds it, and tell waiters.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- ARGV[1]  the owner id
-- ARGV[2]  the release channel     <prefix>{<tag>}:released
--
-- Returns 1 if the lock was this owner's and is now deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
