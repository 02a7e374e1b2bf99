-- tollgate: give back the places a shaped request took in a policy's
-- leaky_bucket limits when it leaves before its release, in one call: the
-- Lua twin of CancelShaped in core/algo/step.go (StoreSide.ApplyCancel) is
-- algo.Lua's cancel_shaped; this file applies it to decide.lua's state hash
-- (cancelScript is algo.Lua, state.lua, then this file).
--
-- KEYS[1]  the policy's state hash, as decide.lua keeps it (each state in
--          the form state.lua reads and writes)
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

for i = 3, #ARGV, 4 do
  local id, w, n, release = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local v = redis.call('HMGET', KEYS[1], id)[1]
  if v then
    local s = parse(v, {})
    local a, b = cancel_shaped({n = n, w = w}, s, now, release, cost)
    if a then redis.call('HSET', KEYS[1], id, pack(a, b, 0, s[4])) end
  end
end
return now
