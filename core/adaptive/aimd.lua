-- tollgate: the Lua twin of AIMD in aimd.go, operation for operation. One
-- node's verdict for an interval moves a policy's fleet-wide factor at most
-- once per interval. Factors are written with %.17g so Go reads back the
-- very double Lua computed.
--
-- KEYS[1]  a hash: f (factor), d (last decrease µs), i (last increase µs)
-- ARGV[1]  now in µs, or -1 to use the server's TIME
-- ARGV[2]  1 if this node found the interval congested, else 0
-- ARGV[3..6] decrease, increase, min factor, interval µs
-- Returns the factor in force, as a string.

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local congested = tonumber(ARGV[2])
local decrease, increase, minf, interval = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local gap = interval - math.floor(interval / 8)
local v = redis.call('HMGET', KEYS[1], 'f', 'd', 'i')
local f, d, i = tonumber(v[1]) or 1, tonumber(v[2]) or 0, tonumber(v[3]) or 0
if congested == 1 then
  if now - d >= gap then
    f = math.max(minf, f * decrease)
    d = now
  end
elseif now - d >= gap and now - i >= gap then
  f = math.min(1, f + increase)
  i = now
end
local fs = string.format('%.17g', f)
redis.call('HSET', KEYS[1], 'f', fs, 'd', string.format('%.0f', d), 'i', string.format('%.0f', i))
redis.call('PEXPIRE', KEYS[1], math.floor(interval / 1000) * 60 + 1000)
return fs
