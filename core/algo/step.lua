-- tollgate: decide one request for every stacked limit of a policy, all or
-- nothing, in one call; or a pipeline's batch of such requests, in order, in
-- one call. Each algorithm mirrors its Go step function in core/algo/step.go
-- operation for operation: every integer stays below 2^53, so Lua's doubles
-- compute exactly what Go's int64s do, and the sliding counter's double
-- expressions are evaluated in the same order.
--
-- One request:
-- KEYS[1]   a hash holding every limit's state but sliding logs': field
--           <limit id>, value the state as state.lua (run before this file)
--           stores it, with when the hash expires; an in_flight limit's
--           lease counter, field "seq:<limit id>"; and in a hash that holds
--           no state, when it expires, field "expires:ms" (Unix ms, the
--           server's clock)
-- KEYS[2..] the sorted sets of its sliding_log and in_flight limits, in
--           the limits' order (members unique, scored by the time taken);
--           no key for a limit of another algorithm
-- ARGV[1]  now in µs, or -1 to use the server's TIME
-- ARGV[2]  cost, or -1 to probe (cost 0, nothing written)
-- ARGV[3]  number of limits
-- ARGV[4]  ttl ms of every key (the policy's idle time): a key lives at
--          least ttl after its last write (a hash at most 2 ttl)
-- then per limit, 7 values: algorithm + 16 × mode, count, window µs, burst,
--          max delay µs, calendar months (1 or 12 for a calendar fixed
--          window, else 0), limit id; the mode is core.LimitMode: 0 the
--          request's cost is stepped (all or nothing), 1 checked (check),
--          2 charged whatever is left (charge, always written), 3 stepped
--          at cost 0 and not written
-- Returns: now, then per limit: allowed (0/1), remaining, reset µs, retry µs, delay µs;
-- when denied, then per limit its state as stored, so a deny cache can run
-- the step on it: its three integers, or for a sliding log (or in_flight) its live count
-- k and its k live times oldest first (k = -1 and no times when more than 64
-- are live).
--
-- A batch (standalone Redis and Sentinel: its keys span many Cluster slots):
-- ARGV[1]  -2
-- ARGV[2]  number of policies, then per policy: number of limits, ttl ms,
--          and its limits' 7 values each, as above
-- then per request, 3 values: its policy (counted from 1), now (-1: the
--          server's TIME, read once for the batch) and cost
-- KEYS     per request in turn, its keys as above
-- Returns one flat array: per request in order, the length of its reply
-- then its reply as above, or -1 then the error it met as a string (one
-- request's error does not stop the others). One flat array, not one per
-- request, because Redis turns each Lua table of a reply into RESP at a
-- cost of its own.
local FIXED, LOG, COUNTER, BUCKET, GCRA, SHAPER, INFLIGHT, PENALTY = 1, 2, 3, 4, 5, 6, 7, 8
local STEP, CHECK, CHARGE, REPORT = 0, 1, 2, 3 -- core.LimitMode
local MAX_INFLIGHT_RETRY = 1000000 -- core.MaxInFlightRetry, µs

-- Integer division truncating toward zero, exact for |a| < 2^53.
local function idiv(a, b)
  local neg = a < 0
  if neg then a = -a end
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  if neg then return -q end
  return q
end
local function ceildiv(a, b) return idiv(a + b - 1, b) end
-- Every value is an integer below 2^53, which Redis's Lua formats exactly
-- with %d (a C long), and faster than with %.0f.
local function fmt(x) return string.format('%d', x) end

local function window_start(t, w) return t - (t % w) end

-- Days from 1970-01-01 to the first of month m of year y, and the year and
-- month of day z since 1970-01-01: proleptic Gregorian, as Go's time package
-- (Howard Hinnant's days_from_civil and civil_from_days).
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5)
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- The start and end (µs) of l's fixed window holding t: aligned to the Unix
-- epoch, or the calendar month or year in UTC (calendarBounds in Go).
local DAY = 86400000000
local function window_bounds(l, t)
  if l.months == 0 then
    local start = window_start(t, l.w)
    return start, start + l.w
  end
  local y, m = civil_from_days(math.floor(t / DAY))
  if l.months == 12 then m = 1 end
  local y2, m2 = y, m + l.months
  if m2 > 12 then y2, m2 = y2 + 1, m2 - 12 end
  return days_from_civil(y, m) * DAY, days_from_civil(y2, m2) * DAY
end

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

-- time_of is a request's now: its own, or for -1 the server's TIME, read
-- at most once per call.
local server
local function time_of(now)
  if now >= 0 then return now end
  if not server then
    local t = redis.call('TIME')
    server = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server
end

-- A state hash expires two ttls after the write that set its expiry, and
-- the expiry is moved only by a write that finds less than one ttl left:
-- a key still lives at least ttl after its last write, and most writes
-- skip a PEXPIRE. The hash records its expiry (Unix ms, by the server's
-- clock, which Redis also expires keys by; the real expiry, set by a
-- PEXPIRE just after, is never earlier) in every state it holds (see
-- state.lua): a write stores all of a policy's states at once, each with
-- the same expiry. A hash with no state (a policy of sliding_log and
-- in_flight limits only, whose in_flight lease counter lives in it)
-- records it in the field EXPIRES.
--
-- Policies of one name share the hash, each limit in its own field (a
-- reload that adds, removes or changes a limit keeps the others' states),
-- so a policy reads only its own fields' records, and another policy may
-- have moved the expiry since. What a record says is never later than the
-- real expiry, so a write reads the least of its fields' records: when
-- that leaves at least ttl, the hash does too. Otherwise it asks Redis
-- (PTTL, about once a ttl) and moves the expiry only if less than ttl is
-- really left, and only later: a write never shortens the life another
-- policy's limits need. renewed_expiry returns the new expiry (nil: keep
-- the hash's) and the expiry to record.
local EXPIRES = 'expires:ms'
local function renewed_expiry(stored, ttl, hash)
  local at = math.floor(time_of(-1) / 1000)
  if stored and stored - at >= ttl then return nil, stored end
  local left = redis.call('PTTL', hash)
  if left >= ttl then return nil, at + left end
  return at + 2 * ttl, at + 2 * ttl
end

local steps = {[FIXED] = fixed, [COUNTER] = counter, [BUCKET] = bucket, [GCRA] = gcra, [SHAPER] = shaper, [PENALTY] = penalty}

-- The n limits whose 7 values each start after ARGV[base]; the hash fields
-- holding their states, and EXPIRES when none has one; the first limit
-- with a state in the hash (stateful, nil when none); how many keys a
-- request under them has (keys), and for each logged limit which of them
-- is its sorted set (key).
local function read_limits(base, n)
  local limits = {fields = {}, keys = 1}
  for i = 1, n do
    local at = base + (i - 1) * 7
    local coded = tonumber(ARGV[at + 1])
    limits[i] = {alg = coded % 16, mode = math.floor(coded / 16), n = tonumber(ARGV[at + 2]), w = tonumber(ARGV[at + 3]),
                 b = tonumber(ARGV[at + 4]), d = tonumber(ARGV[at + 5]), months = tonumber(ARGV[at + 6]),
                 id = ARGV[at + 7]}
    limits.fields[i] = limits[i].id
    if limits[i].mode == CHARGE then limits.charging = true end
    if limits[i].alg == PENALTY then limits.penalty = i end
    if logged(limits[i]) then
      limits.keys = limits.keys + 1
      limits[i].key = limits.keys
    elseif not limits.stateful then
      limits.stateful = i
    end
  end
  if not limits.stateful then limits.fields[n + 1] = EXPIRES end
  return limits
end

-- A request's working tables, reused by every request of a call: Redis's
-- Lua collects garbage in proportion to what a script allocates, and
-- allocating these per request cost 7-10% of Redis's CPU per decision
-- (batches of one-limit requests). decide sets entries 1..#limits before it
-- reads them, and keeps nothing in them past its return. parsed[i] is limit
-- i's stored state as parse reads it; nexts[i] and results[i] the tables
-- its step function writes into.
local states, nexts, results, parsed, hset, charged = {}, {}, {}, {}, {}, {}

-- One request of cost (-1: a probe) at now under limits, its keys from
-- KEYS[kb + 1]: writes the reply described at the top into out after
-- out[o], and returns the index of its last value.
local function decide(limits, kb, now, cost, ttl, out, o)
  -- A cost of -1 probes: it decides as a request of cost 0 and writes
  -- nothing (an operator reading a key changes nothing, not even its expiry).
  local probe = cost < 0
  if probe then cost = 0 end
  local nlimits = #limits
  local hash = KEYS[kb + 1]
  local stored = redis.call('HMGET', hash, unpack(limits.fields))
  local all, seq_written = true, false
  for i = 1, nlimits do
    local l = limits[i]
    if not parsed[i] then parsed[i], nexts[i], results[i] = {}, {}, {} end
    local mode, r = l.mode, results[i]
    if logged(l) then
      local key = KEYS[kb + l.key]
      if mode == STEP then
        states[i] = logged_step(l, key, now, cost, r)
      elseif mode == CHECK then
        states[i] = logged_step(l, key, now, math.min(cost, 1), r)
        if r[1] == 1 then states[i] = logged_step(l, key, now, 0, r) end
      elseif mode == REPORT or probe then
        states[i] = logged_step(l, key, now, 0, r)
      else
        -- Charged: written at once, whatever the other limits say (a
        -- sorted set is written in place), then reported as a request of
        -- cost 0 sees it. Its times are numbered by the lease counter, so
        -- they never collide with a request's "<now>:<position>".
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - l.w))
        local c = math.min(cost, max_charge(l))
        if c > 0 then
          local top = redis.call('HINCRBY', hash, 'seq:' .. l.id, c)
          for k = 1, c do
            redis.call('ZADD', key, now, fmt(now) .. ':c' .. fmt(top - c + k))
          end
          -- The newest n times alone tell when a request fits (algo.Charge).
          redis.call('ZREMRANGEBYRANK', key, 0, -(l.n + 1))
          redis.call('PEXPIRE', key, ttl)
          seq_written = true
        end
        states[i] = logged_step(l, key, now, 0, r)
      end
    else
      local s = parse(stored[i], parsed[i])
      states[i] = s
      if mode == STEP then
        steps[l.alg](l, s, now, cost, nexts[i], r)
      elseif mode == CHECK then
        steps[l.alg](l, s, now, math.min(cost, 1), nexts[i], r)
        if r[1] == 1 then steps[l.alg](l, s, now, 0, nexts[i], r) end
      elseif mode == REPORT then
        steps[l.alg](l, s, now, 0, nexts[i], r)
      else
        charges[l.alg](l, s, now, math.min(cost, max_charge(l)), charged)
        steps[l.alg](l, charged, now, 0, nexts[i], r)
      end
    end
    if r[1] == 0 then all = false end
  end

  -- A request the other limits denied counts in the penalty box
  -- (Policy.penalize), unless the key is in it already or the request
  -- costs nothing; the box reports as it is after it.
  local pi = limits.penalty
  local penalized = pi and not all and cost > 0 and not limits.charging and results[pi][1] == 1
  if penalized then
    local s = nexts[pi]
    penalize(limits[pi], s, now)
    penalty(limits[pi], s, now, 0, charged, results[pi])
    s[1], s[2], s[3] = charged[1], charged[2], charged[3]
  end

  -- A charge is written whatever its report says, a counted denial in
  -- the penalty box alone, a request's cost only when every limit allows it.
  local write = not probe and (all or limits.charging or penalized)
  if write then
    local stored_expiry
    if limits.stateful then
      for i = 1, nlimits do
        if not logged(limits[i]) and (not stored_expiry or states[i][4] < stored_expiry) then stored_expiry = states[i][4] end
      end
    else
      stored_expiry = tonumber(stored[nlimits + 1])
    end
    local expires, recorded = renewed_expiry(stored_expiry, ttl, hash)
    local fields, hash_written = 0, seq_written
    for i = 1, nlimits do
      local l = limits[i]
      if l.mode == CHECK or l.mode == REPORT or not all and i ~= pi and l.mode == STEP then
        -- Nothing taken: what a request of cost 0 leaves is what is stored.
      elseif l.mode == CHARGE then
        if not logged(l) then
          local s = nexts[i]
          hset[fields + 1] = l.id
          hset[fields + 2] = pack(s[1], s[2], s[3], recorded)
          fields = fields + 2
          -- What the deny cache is sent: the state as now stored.
          states[i][1], states[i][2], states[i][3] = s[1], s[2], s[3]
        end
      elseif l.alg == LOG then
        local key = KEYS[kb + l.key]
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - l.w))
        -- Members are unique: the live count only grows between two requests
        -- at the same µs, so "<now>:<position>" never repeats while live.
        for k = 1, cost do
          redis.call('ZADD', key, now, fmt(now) .. ':' .. fmt(states[i] + k))
        end
        if cost > 0 then redis.call('PEXPIRE', key, ttl) end
      elseif l.alg == INFLIGHT then
        local key = KEYS[kb + l.key]
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - l.w))
        -- A release can shrink the live count between two requests at the
        -- same µs, so members are numbered by a counter instead.
        if cost > 0 then
          local top = redis.call('HINCRBY', hash, 'seq:' .. l.id, cost)
          hash_written = true
          for k = 1, cost do
            redis.call('ZADD', key, now, fmt(now) .. ':' .. fmt(top - cost + k))
          end
          redis.call('PEXPIRE', key, ttl)
        end
      else
        local s = nexts[i]
        hset[fields + 1] = l.id
        hset[fields + 2] = pack(s[1], s[2], s[3], recorded)
        fields = fields + 2
      end
    end
    if fields > 0 or hash_written then
      if not limits.stateful and (expires or recorded ~= stored_expiry) then
        hset[fields + 1] = EXPIRES
        hset[fields + 2] = fmt(recorded)
        fields = fields + 2
      end
      if fields > 0 then redis.call('HSET', hash, unpack(hset, 1, fields)) end
      if expires then redis.call('PEXPIRE', hash, 2 * ttl) end
    end
  end
  if probe or not all then
    -- Nothing is consumed: limits that would have taken the request's cost
    -- report what they still have, as a request of cost 0 sees it (a
    -- penalty box's report does not depend on the cost).
    for i = 1, nlimits do
      local l = limits[i]
      if results[i][1] == 1 and l.mode == STEP and i ~= pi then
        if logged(l) then
          logged_step(l, KEYS[kb + l.key], now, 0, results[i])
        else
          steps[l.alg](l, states[i], now, 0, nexts[i], results[i])
        end
      end
    end
  end

  o = o + 1
  out[o] = now
  for i = 1, nlimits do
    local r = results[i]
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = r[1], r[2], r[3], r[4], r[5]
    o = o + 5
  end
  if not all then
    for i = 1, nlimits do
      local l = limits[i]
      if logged(l) then
        local live = redis.call('ZRANGEBYSCORE', KEYS[kb + l.key], '(' .. fmt(now - l.w), '+inf', 'WITHSCORES')
        local k = #live / 2
        if k > 64 then
          o = o + 1
          out[o] = -1
        else
          o = o + 1
          out[o] = k
          for j = 2, #live, 2 do
            o = o + 1
            out[o] = tonumber(live[j])
          end
        end
      else
        local s = states[i]
        out[o + 1], out[o + 2], out[o + 3] = s[1], s[2], s[3]
        o = o + 3
      end
    end
  end
  return o
end

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
