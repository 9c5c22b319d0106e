-- extend: reset the lock's TTL if this owner holds it.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  optional: the fencing counter <prefix>{<tag>}:fence (same hash tag)
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  with KEYS[2]: the grant's token, in decimal
--
-- With KEYS[2], the counter is first raised to the token if it is lower (see
-- release.lua for why).
--
-- Returns 1 if the lock was this owner's and is extended, else 0.
if KEYS[2] then
  local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
  if fence == nil or fence < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
