-- tollgate: the decide script's entry (after decide.lua): one request, or
-- a batch, as decide.lua's top describes its KEYS and ARGV.

local BATCH = -2
local first = tonumber(ARGV[1])
if first ~= BATCH then
  local out = {}
  decide(read_limits(4, tonumber(ARGV[3])), 0, time_of(first), tonumber(ARGV[2]), tonumber(ARGV[4]), out, 0)
  return out
end

-- A batch: each policy's limits are read once, the server's TIME at most
-- once, and each request decided in turn as if it came alone.
local policies, a = {}, 3
for j = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[a])
  policies[j] = {limits = read_limits(a + 1, n), ttl = tonumber(ARGV[a + 1])}
  a = a + 2 + 7 * n
end
-- A batch's requests send few distinct numbers (policy 1, now -1, cost
-- 1), and tonumber runs the C library's strtod, so each is read once.
local numbers = {}
local function number(v)
  local x = numbers[v]
  if x == nil then
    x = tonumber(v)
    numbers[v] = x
  end
  return x
end
local replies, size, kb = {}, 0, 0
for r = a, #ARGV, 3 do
  local policy = policies[number(ARGV[r])]
  local ok, last = pcall(decide, policy.limits, kb, time_of(number(ARGV[r + 1])), number(ARGV[r + 2]), policy.ttl,
                         replies, size + 1)
  if ok then
    replies[size + 1] = last - size - 1
    size = last
  else
    -- Drop what the request wrote before its error (nothing is written
    -- past the end but by decide, so its values end at the first nil).
    local j = size + 2
    while replies[j] ~= nil do
      replies[j] = nil
      j = j + 1
    end
    -- Redis 7 raises a failed redis.call as a table with an err field;
    -- Lua raises its own errors as strings.
    if type(last) == 'table' and last.err then last = last.err end
    replies[size + 1], replies[size + 2] = -1, tostring(last)
    size = size + 2
  end
  kb = kb + policy.limits.keys
end
return replies
