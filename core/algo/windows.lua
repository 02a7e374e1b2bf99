-- tollgate: the step functions' Lua twins, part 2: fixed window and sliding window counter. Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

-- Each step function writes the state after the request into ns and its
-- verdict into r, and returns them: tables a call reuses, since Redis's Lua
-- collects garbage in proportion to what a script allocates.
local function fixed(l, s, t, c, ns, r)
  local w, n = l.w, l.n
  local start, stop = window_bounds(l, t)
  local used, third = s[2], s[3]
  if s[1] ~= start then used, third = 0, 0 end
  local reset = stop - t
  if used + c <= n then
    ns[1], ns[2], ns[3] = start, used + c, 0
    r[1], r[2], r[3], r[4], r[5] = 1, n - used - c, reset, 0, 0
    return ns, r
  end
  local retry = reset
  if c > n then retry = w end
  ns[1], ns[2], ns[3] = start, used, third
  r[1], r[2], r[3], r[4], r[5] = 0, math.max(0, n - used), reset, retry, 0
  return ns, r
end

local function estimate(prev, curr, w, el) return prev * (w - el) / w + curr end

local function counter_wait(curr, prev, w, n, el, c)
  if c > n then return w end
  if curr + c <= n and prev > 0 then
    local at = math.ceil(w - ((n - curr - c) * w) / prev)
    if at < el then at = el end
    while at < w and estimate(prev, curr, w, at) + c > n do at = at + 1 end
    if at < w then return at - el end
  end
  local at = 0
  if curr > 0 then
    at = math.ceil(w - ((n - c) * w) / curr)
    if at < 0 then at = 0 end
    while at < w and estimate(curr, 0, w, at) + c > n do at = at + 1 end
  end
  return w + at - el
end

local function counter(l, s, t, c, ns, r)
  local w, n = l.w, l.n
  local start = window_start(t, w)
  local curr, prev = s[2], s[3]
  if s[1] == start then
  elseif s[1] == start - w then curr, prev = 0, s[2]
  else curr, prev = 0, 0 end
  local el = t - start
  local est = estimate(prev, curr, w, el)
  if est + c <= n then
    curr = curr + c
    r[1], r[2], r[3], r[4], r[5] = 1, math.floor(n - (est + c)), 0, 0, 0
  else
    local rem = math.floor(n - est)
    if rem < 0 then rem = 0 end
    r[1], r[2], r[3], r[4], r[5] = 0, rem, 0, counter_wait(curr, prev, w, n, el, c), 0
  end
  if curr > 0 then r[3] = start + 2 * w - t
  elseif prev > 0 then r[3] = start + w - t end
  ns[1], ns[2], ns[3] = start, curr, prev
  return ns, r
end
