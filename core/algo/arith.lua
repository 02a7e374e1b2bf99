-- tollgate: the step functions' Lua twins, part 1: the algorithms' codes and the integer and calendar arithmetic they share. Each mirrors its Go step
-- function in core/algo/step.go operation for operation: every integer
-- stays below 2^53, so Lua's doubles compute exactly what Go's int64s do,
-- and the sliding counter's double expressions are evaluated in the same
-- order. algo.Lua is these files in order (arith, windows, buckets,
-- penalty, charge, logs); a store's script follows it and calls them.

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
