-- tollgate: the step functions' Lua twins, part 4: the penalty box. Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

-- The penalty box (stepPenalty): refuses while the key is in the box
-- (until s[3]), else reports the denials the window still takes.
local function penalty(l, s, t, c, ns, r)
  local w, n = l.w, l.n
  local start = window_start(t, w)
  local count = s[2]
  if s[1] ~= start then count = 0 end
  ns[1], ns[2], ns[3] = start, count, s[3]
  if t < s[3] then
    r[1], r[2], r[3], r[4], r[5] = 0, 0, s[3] - t, s[3] - t, 0
    return ns, r
  end
  local reset = 0
  if count > 0 then reset = start + w - t end
  r[1], r[2], r[3], r[4], r[5] = 1, math.max(0, n - count), reset, 0, 0
  return ns, r
end

-- algo.Penalize: counts a denial in s, in place; the n-th of a window
-- puts the key in the box for l.d µs.
local function penalize(l, s, t)
  local start = window_start(t, l.w)
  if s[1] ~= start then s[1], s[2] = start, 0 end
  s[2] = s[2] + 1
  if s[2] >= l.n then s[2], s[3] = 0, t + l.d end
end


-- Every algorithm whose state is three integers, by its code: its step
-- function (the sliding log and in_flight are logged_step's, logs.lua).
local steps = {[FIXED] = fixed, [COUNTER] = counter, [BUCKET] = bucket, [GCRA] = gcra, [SHAPER] = shaper, [PENALTY] = penalty}
