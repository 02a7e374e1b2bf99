-- tollgate: the step functions' Lua twins, part 6: the sliding log and in_flight, over a sorted set of the times taken. Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

-- The sliding log reads its sorted set; nothing is written until commit.
-- It returns the live count and r, its verdict.
local function log_step(l, key, t, c, r)
  local w, n = l.w, l.n
  local live = redis.call('ZCOUNT', key, '(' .. fmt(t - w), '+inf')
  local newest = nil
  if live > 0 then
    newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  end
  if live + c <= n then
    local reset = 0
    if c > 0 then reset = w elseif live > 0 then reset = newest + w - t end
    r[1], r[2], r[3], r[4], r[5] = 1, n - live - c, reset, 0, 0
    return live, r
  end
  local reset = 0
  if live > 0 then reset = newest + w - t end
  local retry = w
  if c <= n then
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(t - w), '+inf', 'WITHSCORES', 'LIMIT', live + c - n - 1, 1)
    retry = tonumber(oldest[2]) + w - t
  end
  r[1], r[2], r[3], r[4], r[5] = 0, math.max(0, n - live), reset, retry, 0
  return live, r
end

-- In flight: the sliding log's count of live leases; a denial's retry is
-- capped (stepInFlight).
local function inflight_step(l, key, t, c, r)
  local live = log_step(l, key, t, c, r)
  if r[1] == 0 then r[4] = math.min(r[4], MAX_INFLIGHT_RETRY) end
  return live, r
end
local function logged(l) return l.alg == LOG or l.alg == INFLIGHT end
local function logged_step(l, key, t, c, r)
  if l.alg == INFLIGHT then return inflight_step(l, key, t, c, r) end
  return log_step(l, key, t, c, r)
end
