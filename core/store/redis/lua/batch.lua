-- tollgate: the decide script's entry (after decide.lua): decide_call
-- answers one call, of one request or a batch, as protocol.lua's top
-- describes its KEYS and ARGV. The script form (DecideLua) ends by
-- returning it; the function form (a Redis function library, kept by the
-- server between calls) calls it from the function it registers.

local BATCH = -2
local function decide_call()
  -- The server's TIME is read at most once per call (time_of): a
  -- function's upvalues outlive its call.
  server = nil
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
  -- Requests in a row of the same policy, now and cost come as one run: a
  -- busy gateway's batch is mostly one run, so Redis reads and converts
  -- four arguments for it, not three per request.
  local replies, size, kb = {}, 0, 0
  for r = a, #ARGV, 4 do
    local policy, now, cost = policies[tonumber(ARGV[r + 1])], time_of(tonumber(ARGV[r + 2])), tonumber(ARGV[r + 3])
    for _ = 1, tonumber(ARGV[r]) do
      local ok, last = pcall(decide, policy.limits, kb, now, cost, policy.ttl, replies, size + 1)
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
  end
  return replies
end
