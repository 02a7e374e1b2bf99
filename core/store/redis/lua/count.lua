-- tollgate: add to windows' shared counts (eventual mode's sync,
-- Store.AddCounts) and read the fleet's back, keeping each as long as its
-- window counts. Expiries only move later, so nodes that sync at different
-- times agree on when a count goes. One call takes many windows: on a
-- Cluster, those of one key's hash slot.
--
-- KEYS[i]     a window's count
-- ARGV[3i-2]  units to add to it (0 to only read)
-- ARGV[3i-1]  ms from now it is kept at least (SharedCount.Keep); under 1:
--             no one counts the window any more, it goes now
-- ARGV[3i]    ms from now it is kept at least if this call creates it
--             (SharedCount.KeepNew)
-- Returns: each window's count, in order.

local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.call('INCRBY', key, ARGV[3 * i - 2])
  local keep = tonumber(ARGV[3 * i - 1])
  if keep < 1 then
    redis.call('DEL', key)
  else
    local ttl = redis.call('PTTL', key)
    if ttl == -1 then -- INCRBY created it, without an expiry
      keep = math.max(keep, tonumber(ARGV[3 * i]))
    end
    if ttl == -1 or ttl < keep then
      redis.call('PEXPIRE', key, keep)
    end
  end
  out[i] = n
end
return out
