-- tollgate: the Lua twin of Gradient in gradient.go, operation for
-- operation. Each node adds its interval's signals to a policy's fleet-wide
-- sums; the first read (no signals) once an interval has passed since the
-- last judgement judges and clears them (signals do, an interval and a
-- half on, only if reads stopped coming). Floats are written with %.17g so Go reads back the
-- very double Lua computed.
--
-- KEYS[1]  a hash: f (factor), g (growth), c (ceiling), m (unloaded latency
--          µs), ms (measuring stage), h (held factor), e (epoch), sl (slow
--          intervals), j (judged µs), s, a, x, l (pending started,
--          answered, failed, Σ latency×successful answers), k (1 after a
--          cut, 2 after one measured over a carried interval: intervals
--          left to wait through), dn (pending denied), pk (peak), pr
--          (clean intervals probed past the capacity), pf (pending Σ
--          factor over started), cs, cv, ca (the carried interval's
--          started, successful answers, Σ factor over started), ds, dv,
--          da and ls, lv, la (the same for a measurement's draining
--          intervals before the last, and for its last), st (pending
--          stalled nodes), as (1 after an interval held for a stall), sh
--          (intervals held in a row for stalls)
-- ARGV[1]  now in µs, or -1 to use the server's TIME
-- ARGV[2..5]  this node's started, answered, failed, latency µs
-- ARGV[6..12] min factor, error rate, tolerance, latency target µs,
--             decrease, increase, interval µs
-- ARGV[13] min samples
-- ARGV[14] this node's denied
-- ARGV[15] this node's admitted: started × the factor it let them through at
-- ARGV[16] 1 if the limits are paced (Options.Paced), else 0
-- ARGV[17] 1 if this node's gateway stalled in the interval, else 0
-- Returns the factor in force, as a string.

local MEASURE_EVERY, MEASURING, LATENCY_SLACK = 40, 5, 1000
local PROBE_STRICTNESS, PROBE_DWELL, MAX_GROWTH = 4, 2, 0.5

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local started, answered, failed, lat = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local denied, admitted = tonumber(ARGV[14]), tonumber(ARGV[15])
local minf, errrate, tol, target = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local decrease, increase, interval, minsamples = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local paced = ARGV[16] == '1'
local stalled = tonumber(ARGV[17])

local v = redis.call('HMGET', KEYS[1], 'f', 'g', 'c', 'm', 'ms', 'h', 'e', 'sl', 'j', 's', 'a', 'x', 'l', 'k', 'dn', 'pk', 'pr', 'pf', 'cs', 'cv', 'ca', 'ds', 'dv', 'da', 'ls', 'lv', 'la', 'st', 'as', 'sh')
local f = tonumber(v[1]) or 1
local growth, ceiling = tonumber(v[2]) or 0, tonumber(v[3]) or 0
local m, ms, held = tonumber(v[4]) or 0, tonumber(v[5]) or 0, tonumber(v[6]) or 0
local epoch, slowcount, j = tonumber(v[7]) or 0, tonumber(v[8]) or 0, tonumber(v[9]) or 0
local ps = (tonumber(v[10]) or 0) + started
local pa = (tonumber(v[11]) or 0) + answered
local px = (tonumber(v[12]) or 0) + failed
local pl = (tonumber(v[13]) or 0) + lat * (answered - failed)
local justcut = tonumber(v[14]) or 0
local pd = (tonumber(v[15]) or 0) + denied
local peak, probed = tonumber(v[16]) or 0, tonumber(v[17]) or 0
local pf = (tonumber(v[18]) or 0) + admitted
local cs, cv, ca = tonumber(v[19]) or 0, tonumber(v[20]) or 0, tonumber(v[21]) or 0
local ds, dv, da = tonumber(v[22]) or 0, tonumber(v[23]) or 0, tonumber(v[24]) or 0
local ls, lv, la = tonumber(v[25]) or 0, tonumber(v[26]) or 0, tonumber(v[27]) or 0
local pst = (tonumber(v[28]) or 0) + stalled
local afterstall, stallheld = tonumber(v[29]) or 0, tonumber(v[30]) or 0
-- A stored count this script never writes (a lying server) must not hold the
-- factor for as many intervals as it says: probed is 0 or 1, k 0 to 2.
probed = math.min(math.max(probed, 0), PROBE_DWELL - 1)
if not (justcut >= 0 and justcut <= 2) then
  justcut = 0
end
-- Nor for stalls: sh is 0 to 2.
if not (stallheld >= 0 and stallheld <= 2) then
  stallheld = 0
end

local function save()
  local g = function(x) return string.format('%.17g', x) end
  local i = function(x) return string.format('%.0f', x) end
  redis.call('HSET', KEYS[1], 'f', g(f), 'g', g(growth), 'c', g(ceiling), 'm', i(m), 'ms', i(ms), 'h', g(held),
    'e', i(epoch), 'sl', i(slowcount), 'j', i(j), 's', i(ps), 'a', i(pa), 'x', i(px), 'l', i(pl), 'k', i(justcut), 'dn', i(pd),
    'pk', g(peak), 'pr', i(probed), 'pf', g(pf), 'cs', i(cs), 'cv', i(cv), 'ca', g(ca),
    'ds', i(ds), 'dv', i(dv), 'da', g(da), 'ls', i(ls), 'lv', i(lv), 'la', g(la),
    'st', i(pst), 'as', i(afterstall), 'sh', i(stallheld))
  redis.call('PEXPIRE', KEYS[1], math.floor(interval / 1000) * 60 + 1000)
  return g(f)
end

-- A read (no signals) judges; signals only once reads stopped coming.
local read = started == 0 and answered == 0 and failed == 0 and lat == 0 and denied == 0 and admitted == 0 and stalled == 0
if now - j < interval - math.floor(interval / 8) or (not read and (j == 0 or now - j < interval + math.floor(interval / 2))) then
  return save()
end
j = now
local sa, ans, fl, sl, dn, adm = ps, pa, px, pl, pd, pf
ps, pa, px, pl, pd, pf = 0, 0, 0, 0, 0, 0
local st = pst
pst = 0
-- A gateway's stall: this interval is held, and the next; a third in a
-- row is judged (holdForStall).
local hold = false
if st > 0 then
  hold, afterstall = true, 1
elseif afterstall == 1 then
  hold, afterstall = true, 0
end
if hold and stallheld >= 2 then
  hold = false
end
if hold then
  stallheld = stallheld + 1
  return save()
end
stallheld = 0
local csa, csv, cadm = cs, cv, ca
cs, cv, ca = 0, 0, 0
local latency = 0
if ans - fl > 0 then
  latency = math.floor(sl / (ans - fl))
end
local enough = ans >= minsamples
local admittedf = f
if sa + csa > 0 and adm + cadm > 0 then
  admittedf = math.min(1, (adm + cadm) / (sa + csa))
end
if ms > 0 and ms < MEASURING then
  -- A paced limit binding at the held factor against a draining upstream:
  -- answers over started is the capacity.
  if paced and ans > sa and dn > 0 and sa > 0 then
    ds, dv, da = ds + ls, dv + lv, da + la
    ls, lv, la = sa, ans - fl, admittedf * sa
  end
  if ans > sa and ms < MEASURING - 1 then
    ms = ms + 1
  else
    ms = MEASURING
  end
  return save()
elseif ms == MEASURING then
  if latency > 0 then
    m = latency
  end
  -- Every draining interval but the last drained all interval long.
  local es, ev, ea = ds, dv, da
  if es == 0 then
    es, ev, ea = ls, lv, la
  end
  if paced and es > 0 then
    local c = ea / es * ev / es
    held = math.min(held, math.max(minf, c * decrease))
  end
  f, held, ms, epoch, slowcount = held, 0, 0, 0, 0
  ds, dv, da, ls, lv, la = 0, 0, 0, 0, 0, 0
  return save()
end
epoch = epoch + 1
local congested, slow, piling = false, false, false
local served, cut = 1.0, 1.0
if enough then
  if latency > 0 and latency < m then
    m = latency
  end
  local rate = errrate
  if (ceiling > 0 and f > ceiling) or (peak > 0 and f > peak) then
    rate = rate / PROBE_STRICTNESS
  end
  local failing = fl > rate * ans
  local backlog = ans < (1 - errrate) * sa
  if m == 0 then
    -- No unloaded latency yet: the interval's last latency is still out.
    local back = math.max(0, 1 - latency / interval)
    piling = ans < (1 - errrate) * back * sa or (backlog and dn > 0)
  else
    piling = backlog and epoch > 1 and latency > 1.1 * m
  end
  congested = failing or piling
  served = (ans - fl + csv) / math.max(sa + csa, ans + csv)
  cut = served
  local tolerated = 0
  if m > 0 then
    tolerated = math.max(tol * m, m + LATENCY_SLACK)
  end
  for _, bound in ipairs({tolerated, target}) do
    if bound > 0 and latency > bound and ans <= sa then
      congested, slow = true, true
      cut = math.min(cut, math.max(0.5, bound / latency))
    end
  end
end
if slow then
  slowcount = slowcount + 1
end
if justcut >= 1 then
  if justcut == 1 then
    cs, cv, ca = sa, ans - fl, adm
  end
  justcut = justcut - 1
  return save()
end
if congested then
  local measured = admittedf * served
  local confirmed = dn > 0 and ceiling > 0 and f <= ceiling * (1 + 2 * increase) and measured <= f
  ceiling = math.min(f, measured)
  if confirmed then
    peak = math.max(peak, ceiling)
  end
  f = math.max(minf, math.min(f, admittedf * cut) * decrease)
  growth, justcut, probed = 0, 1, 0
  if csa > 0 then
    justcut = 2
  end
else
  local was = probed
  probed = 0
  local step = growth
  if step == 0 then
    step = increase
  end
  local nxt = f * (1 + step)
  growth = math.min(MAX_GROWTH, step * 2)
  local rising = enough and m > 0 and latency > (1 + tol) / 2 * m
  local clean = enough and fl == 0 and not rising
  local probing = ceiling
  if probing == 0 then
    probing = peak
  end
  if f < ceiling and nxt > ceiling then
    nxt, growth = ceiling, 0
  elseif ceiling == 0 and f < peak and nxt > peak then
    nxt, growth = peak, 0
  elseif clean and ceiling > 0 and f > ceiling * (1 + increase / 2) and f < peak * decrease then
    ceiling = 0
    nxt, growth = f * (1 + 2 * step), math.min(MAX_GROWTH, 4 * step)
  elseif clean and probing > 0 and f > probing * (1 + increase / 2) then
    probed = was + 1
    if probed < PROBE_DWELL then
      nxt, growth = f, step
    elseif ceiling > 0 then
      -- Forgotten: the same step once more before it doubles.
      ceiling, probed, growth = 0, 0, step
    else
      peak, probed, growth = 0, 0, step
    end
  elseif (f >= ceiling and f < ceiling * (1 + increase)) or rising then
    growth = step
  end
  f = math.min(1, nxt)
end
if enough and latency > 0 and m == 0 and dn == 0 and not piling then
  m = latency
end
if enough and latency > 0 and (m == 0 or (slow and epoch >= MEASURE_EVERY) or slowcount >= MEASURE_EVERY) then
  held, f, ms, justcut = f, minf, 1, 0
  ds, dv, da, ls, lv, la = 0, 0, 0, 0, 0, 0
end
return save()
