-- tollgate: the step functions' Lua twins, part 5: charges (algo.Charge). Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

-- The twins of algo.Charge: each writes into ns the state after c units
-- (at most max_charge) are taken whatever the limit has left.
local MAX_EXACT_QUARTER = 2 ^ 51
local function max_charge(l)
  if l.alg == BUCKET or l.alg == GCRA then
    return math.min(math.max(l.n, l.b), idiv(MAX_EXACT_QUARTER, l.w))
  end
  return l.n
end
local refill_r = {}
local charges = {
  [FIXED] = function(l, s, t, c, ns)
    local start = window_bounds(l, t)
    local used = s[2]
    if s[1] ~= start then used = 0 end
    ns[1], ns[2], ns[3] = start, used + c, 0
  end,
  [COUNTER] = function(l, s, t, c, ns)
    local w = l.w
    local start = window_start(t, w)
    local curr, prev = s[2], s[3]
    if s[1] == start then
    elseif s[1] == start - w then curr, prev = 0, s[2]
    else curr, prev = 0, 0 end
    ns[1], ns[2], ns[3] = start, curr + c, prev
  end,
  [BUCKET] = function(l, s, t, c, ns)
    bucket(l, s, t, 0, ns, refill_r) -- refilled to t
    ns[1] = ns[1] + c * l.w
  end,
  [GCRA] = function(l, s, t, c, ns)
    local tat, frac = advance(s, t, l.w, l.n, c)
    ns[1], ns[2], ns[3] = tat, frac, 0
  end,
}
