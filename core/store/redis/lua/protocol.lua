-- tollgate: decide one request for every stacked limit of a policy, all or
-- nothing, in one call; or a pipeline's batch of such requests, in order, in
-- one call. The script is algo.Lua (the step functions' twins, which this
-- file calls: steps, charges, logged_step, penalize, penalty), state.lua
-- (the stored form of a state), then this file, decide.lua and batch.lua:
-- redis.DecideLua.
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
-- then per run of requests in a row with the same policy, now and cost,
--          4 values: how many requests, their policy (counted from 1),
--          now (-1: the server's TIME, read once for the batch) and cost
-- KEYS     per request in turn, its keys as above
-- Returns one flat array: per request in order, the length of its reply
-- then its reply as above, or -1 then the error it met as a string (one
-- request's error does not stop the others). One flat array, not one per
-- request, because Redis turns each Lua table of a reply into RESP at a
-- cost of its own.
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
