-- release: delete the lock if this owner holds it, and tell waiters.
--
-- KEYS[1]  the lock key            <prefix>{<tag>}
-- KEYS[2]  optional: the fencing counter <prefix>{<tag>}:fence (same hash tag)
-- ARGV[1]  the owner id
-- ARGV[2]  the release channel     <prefix>{<tag>}:released
-- ARGV[3]  with KEYS[2]: the grant's token, in decimal
--
-- With KEYS[2], the counter is first raised to the token if it is lower,
-- whether or not the lock is still this owner's: Redlock's token is the
-- maximum over a quorum of per-node counters, and writing it back makes every
-- later quorum, which overlaps this one, count from above it. Raising a
-- counter to a token that was issued never sends tokens backwards.
--
-- Returns 1 if the lock was this owner's and is now deleted, else 0.
if KEYS[2] then
  local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
  if fence == nil or fence < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
