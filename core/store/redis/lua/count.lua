-- tollgate: add to one window's shared count (eventual mode's sync,
-- Store.AddCounts) and read the fleet's back, keeping it as long as the
-- window counts. Expiries only move later, so nodes that sync at different
-- times agree on when a count goes.
--
-- KEYS[1]  the window's count
-- ARGV[1]  units to add (0 to only read)
-- ARGV[2]  ms from now the count is kept at least (SharedCount.Keep);
--          under 1: no one counts the window any more, it goes now
-- ARGV[3]  ms from now a count this call creates is kept at least
--          (SharedCount.KeepNew)
-- Returns: the count.

local n = redis.call('INCRBY', KEYS[1], ARGV[1])
local keep = tonumber(ARGV[2])
if keep < 1 then
  redis.call('DEL', KEYS[1])
  return n
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then -- INCRBY created it, without an expiry
  keep = math.max(keep, tonumber(ARGV[3]))
end
if ttl == -1 or ttl < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return n
