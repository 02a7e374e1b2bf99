-- tollgate: end or renew the leases one request holds in a policy's
-- in_flight limits, in one call. The Lua twin of EndLease in core/algo/step.go
-- (StoreSide.ApplyLease), over decide.lua's sorted sets: a lease is live while
-- its score (the time it was taken or renewed) is after now - window.
--
-- KEYS[i]  an in_flight limit's sorted set, as decide.lua keeps it
-- ARGV[1]  now in µs, or -1 to use the server's TIME
-- ARGV[2]  the lease's token: the µs it was taken or last renewed at
-- ARGV[3]  how many slots it holds (its cost)
-- ARGV[4]  1 to renew, 0 to end
-- ARGV[5]  ttl ms of the keys (the policy's idle time)
-- ARGV[5+i] KEYS[i]'s window (the lease) in µs
-- Returns: now, then per key how many of the lease's slots it found.

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local token, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local renew, ttl = ARGV[4] == '1', tonumber(ARGV[5])
local function fmt(x) return string.format('%.0f', x) end

local out = {now}
for i, key in ipairs(KEYS) do
  local w = tonumber(ARGV[5 + i])
  local found = 0
  if token > now - w then
    -- Slots taken together share a score; which of them goes is alike.
    local members = redis.call('ZRANGEBYSCORE', key, fmt(token), fmt(token), 'LIMIT', 0, cost)
    found = #members
    for _, m in ipairs(members) do
      if renew then
        redis.call('ZADD', key, now, m)
      else
        redis.call('ZREM', key, m)
      end
    end
    if renew and found > 0 then redis.call('PEXPIRE', key, ttl) end
  end
  out[#out + 1] = found
end
return out
