-- tollgate: the decide script's decision of one request (after
-- protocol.lua, whose top describes the KEYS, ARGV and reply): each limit
-- stepped, what the request takes written, the reply built.

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
