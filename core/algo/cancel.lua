-- tollgate: give back the places a shaped request took in a policy's
-- leaky_bucket limits when it leaves before its release, in one call. The
-- Lua twin of CancelShaped in core/algo/step.go (Policy.ApplyCancel), on
-- step.lua's state hash, with the same integer arithmetic.
--
-- KEYS[1]  the policy's state hash, as step.lua keeps it (each state in
--          the form state.lua, run before this file, reads and writes)
-- ARGV[1]  now in µs, or -1 to use the server's TIME
-- ARGV[2]  the request's cost
-- then per limit that shaped it, 4 values: limit id, window µs, count, release µs
-- Returns now.

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])

-- As step.lua's: exact for |a| < 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

for i = 3, #ARGV, 4 do
  local id, w, n, release = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local v = redis.call('HMGET', KEYS[1], id)[1]
  if v and release > now then
    local s = parse(v, {})
    local a, b, expires = s[1], s[2], s[4]
    local ahead = 0
    if a >= now then ahead = (a - now) * n + b end
    ahead = ahead - cost * w
    if ahead <= 0 then
      a, b = now, 0
    else
      a, b = now + idiv(ahead, n), ahead % n
    end
    redis.call('HSET', KEYS[1], id, pack(a, b, 0, expires))
  end
end
return now
