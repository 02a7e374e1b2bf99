-- tollgate: the stored form of one limit's state in a policy's state hash,
-- shared by the decide and cancel scripts (each is algo.Lua, this file, then
-- its own). A state is three integers below 2^53, as the step functions
-- keep it, and the hash's expiry as of the write that stored it (Unix ms,
-- by the server's clock; 0: not known), stored as a format byte (1) and
-- four little-endian doubles. Lua's struct reads and writes that without
-- the decimal conversions of the text form "a b c" that earlier releases
-- wrote (in batches of one-limit requests, 0.6-0.8 µs less of Redis's CPU
-- per decision), and the expiry travels with the state instead of in a
-- field of its own (0.3 µs less). The text form is still read, so an
-- upgrade keeps every count.
local STATE_FORMAT = 1
local EXACT = 2 ^ 53

-- parse reads a stored state (nil: never written) into s: its three
-- integers, then the expiry stored with it. A stored value that is neither
-- form fails the request: Redis holds something tollgate did not write
-- there, and no decision is made on it.
local function parse(v, s)
  local a, b, c, e = 0, 0, 0, 0
  if v then
    if #v == 33 and string.byte(v) == STATE_FORMAT then
      local _
      _, a, b, c, e = struct.unpack('<Bdddd', v)
    else
      a, b, c = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+)$')
      a, b, c = tonumber(a), tonumber(b), tonumber(c)
    end
    -- Each must be an integer Lua holds exactly (nil, NaN and the
    -- infinities are not: x % 1 is NaN for them), the expiry not negative.
    if not (a and b and c) or a % 1 ~= 0 or b % 1 ~= 0 or c % 1 ~= 0 or e % 1 ~= 0 or a <= -EXACT or a >= EXACT
        or b <= -EXACT or b >= EXACT or c <= -EXACT or c >= EXACT or e < 0 or e >= EXACT then
      error('tollgate: a stored state is unreadable (not written by tollgate)', 0)
    end
  end
  s[1], s[2], s[3], s[4] = a, b, c, e
  return s
end

-- pack is the stored form of the state a, b, c written with the hash's
-- expiry expires.
local function pack(a, b, c, expires) return struct.pack('<Bdddd', STATE_FORMAT, a, b, c, expires) end
