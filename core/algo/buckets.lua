-- tollgate: the step functions' Lua twins, part 3: token bucket, GCRA and the leaky bucket shaper. Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

local function bucket(l, s, t, c, ns, r)
  local w, n, b = l.w, l.n, l.b
  local capacity = b * w
  local deficit, last = s[1], s[2]
  local elapsed = t - last
  if deficit > 0 and elapsed > 0 then
    if elapsed >= ceildiv(deficit, n) then deficit = 0 else deficit = deficit - elapsed * n end
  end
  if t > last then last = t end
  local need = c * w
  if c <= b and deficit + need <= capacity then
    deficit = deficit + need
    ns[1], ns[2], ns[3] = deficit, last, 0
    r[1], r[2], r[3], r[4], r[5] = 1, idiv(capacity - deficit, w), ceildiv(deficit, n), 0, 0
    return ns, r
  end
  local retry = w
  if c <= b then retry = ceildiv(deficit + need - capacity, n) end
  ns[1], ns[2], ns[3] = deficit, last, 0
  r[1], r[2], r[3], r[4], r[5] = 0, math.max(0, idiv(capacity - deficit, w)), ceildiv(deficit, n), retry, 0
  return ns, r
end

local function ahead_of(s, t, n)
  if s[1] < t then return 0 end
  return (s[1] - t) * n + s[2]
end

local function advance(s, t, w, n, c)
  local tat, frac = s[1], s[2]
  if tat < t then tat, frac = t, 0 end
  local total = frac + c * w
  return tat + idiv(total, n), total % n
end

local function gcra(l, s, t, c, ns, r)
  local w, n, b = l.w, l.n, l.b
  local tolerance = b * w
  local prev = ahead_of(s, t, n)
  local retry = w
  if c <= b then
    local tat, frac = advance(s, t, w, n, c)
    local ahead = (tat - t) * n + frac
    if ahead <= tolerance then
      ns[1], ns[2], ns[3] = tat, frac, 0
      r[1], r[2], r[3], r[4], r[5] = 1, idiv(tolerance - ahead, w), ceildiv(ahead, n), 0, 0
      return ns, r
    end
    retry = ceildiv(ahead - tolerance, n)
  end
  ns[1], ns[2], ns[3] = s[1], s[2], s[3]
  r[1], r[2], r[3], r[4], r[5] = 0, math.max(0, idiv(tolerance - prev, w)), ceildiv(prev, n), retry, 0
  return ns, r
end

local function shaper_room(ahead, max_wait, queue, w)
  if ahead > max_wait or ahead > queue then return 0 end
  return math.min(idiv(max_wait - ahead, w) + 1, idiv(queue - ahead, w))
end

local function shaper(l, s, t, c, ns, r)
  local w, n, b = l.w, l.n, l.b
  local max_wait, queue = l.d * n, b * w
  local wait = ahead_of(s, t, n)
  local retry = w
  if c <= b then
    local tat, frac = advance(s, t, w, n, c)
    local nxt = (tat - t) * n + frac
    if wait <= max_wait and nxt <= queue then
      ns[1], ns[2], ns[3] = tat, frac, 0
      r[1], r[2], r[3], r[4], r[5] = 1, shaper_room(nxt, max_wait, queue, w), ceildiv(nxt, n), 0, ceildiv(wait, n)
      return ns, r
    end
    retry = ceildiv(math.max(wait - max_wait, nxt - queue), n)
  end
  ns[1], ns[2], ns[3] = s[1], s[2], s[3]
  r[1], r[2], r[3], r[4], r[5] = 0, shaper_room(wait, max_wait, queue, w), ceildiv(wait, n), retry, 0
  return ns, r
end

-- A shaped request of cost c that leaves before its release gives its
-- places back (CancelShaped): the shaper's state after, as its first two
-- integers, or nil when nothing changes (released already).
local function cancel_shaped(l, s, t, release, c)
  if release <= t then return nil end
  local n = l.n
  local ahead = ahead_of(s, t, n) - c * l.w
  if ahead <= 0 then return t, 0 end
  return t + idiv(ahead, n), ahead % n
end
