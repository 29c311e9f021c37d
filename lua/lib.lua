-- lib.lua: helpers prepended to every script of this package (lua.go).
--
-- Redis Lua numbers are float64: every value the scripts hold stays an
-- integer below 2^53 (within the ranges tierlimit.Limit.Validate accepts),
-- divisions go through idiv/cdiv, which correct float rounding so that they
-- are exact, and a product that may pass 2^53 goes through muldiv, which
-- carries a remainder instead of rounding.
--
-- ARGV[1] of every script is a client clock in microseconds, or 0 to read the
-- server clock (TIME), which is the default: app servers' clocks never decide.

-- The library functions the scripts call most, as locals: a global's
-- function is two table reads at each call.
local floor, max, min = math.floor, math.max, math.min
local format, match, find, sub, gmatch = string.format, string.match, string.find, string.sub, string.gmatch

-- num returns the number a decimal string spells, for strings these
-- scripts and the store write, which always spell one: arithmetic coerces
-- the string once, where tonumber converts it twice (Lua 5.1 checks with
-- lua_isnumber, then converts with lua_tonumber, strtod each time), which
-- was a tenth of a ledger claim's instructions.
local function num(s)
  return s + 0
end

local function now_us()
  local o = num(ARGV[1])
  if o > 0 then return o end
  local t = redis.call('TIME')
  return num(t[1]) * 1000000 + num(t[2])
end

-- idiv returns floor(a / b) exactly for integers 0 <= a, 0 < b, a/b < 2^53.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- cdiv returns ceil(a / b) exactly, under the same conditions as idiv.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- ttl_ms returns a TTL in ms that outlasts us microseconds (at least 1 ms).
local function ttl_ms(us)
  return cdiv(max(us, 1), 1000) + 1
end

-- put stores a state string under key with a TTL of at least us
-- microseconds, in one command: no key of ours ever lives without a TTL.
local function put(key, value, us)
  redis.call('SET', key, value, 'PX', ttl_ms(us))
end

-- expire_us gives key a TTL of at least us microseconds.
local function expire_us(key, us)
  redis.call('PEXPIRE', key, ttl_ms(us))
end

-- once reports whether the refund whose marker is key (nil: none) is to be
-- applied: only if the marker does not exist. go-redis resends a command
-- whose connection broke, and a refund that ran before the break must not
-- run twice: that would mint tokens.
local function once(key)
  return not key or redis.call('EXISTS', key) == 0
end

-- done writes the marker key (nil: none) of a refund once applies: it
-- holds took, what the refund took back, for 30 s, so that a holder whose
-- call got no reply can learn whether it ran (store.Limiter.Applied).
local function done(key, took)
  if key then redis.call('SET', key, took, 'PX', 30000) end
end

-- muldiv returns q, r with a·b + c = q·d + r and 0 <= r < d, exactly, for
-- integers a, b >= 0, 0 <= c < 2^52, 0 < d <= 2^51, and q < 2^53 (the
-- caller's bound: the product itself may pass 2^53). Products below 2^52
-- are exact in float64 and take one division; larger ones split b into
-- bq·d + br and add up a·br bit by bit of a, doubling a remainder below d.
local function muldiv(a, b, c, d)
  local p = a * b
  if p <= 4503599627370496 then -- 2^52: p is exact, p + c < 2^53
    local q = idiv(p + c, d)
    return q, p + c - q * d
  end
  local bq = idiv(b, d)
  local br = b - bq * d
  local q = idiv(c, d)
  local r = c - q * d
  q = q + a * bq
  local bit = 1
  while bit * 2 <= a do bit = bit * 2 end
  local hq, hr, rest = 0, 0, a -- hq·d + hr = br × (the bits of a read so far)
  while bit >= 1 do
    hq, hr = hq * 2, hr * 2
    if hr >= d then hq, hr = hq + 1, hr - d end
    if rest >= bit then
      rest = rest - bit
      hr = hr + br
      if hr >= d then hq, hr = hq + 1, hr - d end
    end
    bit = bit / 2
  end
  q, r = q + hq, r + hr
  if r >= d then q, r = q + 1, r - d end
  return q, r
end

-- The token bucket's level is k whole tokens and r/unit of one more
-- (0 <= r < unit), where one token is unit units and a µs refills per
-- units (tierlimit.Limit.Scale: Period in µs and Rate over their gcd). Two
-- limbs, because k × unit may pass 2^53: the level in units never is
-- formed. A key in debt (a Settle took more than it held) has k < 0, down
-- to -cap: waits then reach 2·MaxFill at most, still below 2^53 µs with
-- the clock added.

-- pair_get returns the two integers and the limit of a state "a:b:lim" at
-- key (lim: the limit it was written under, as the script's ARGV spells
-- it), or nil when the key is absent.
local function pair_get(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local a, b, lim = match(v, '^(%d+):(%d+):(.+)$')
  return num(a), num(b), lim
end

-- window_limit returns the period (µs) and rate of a window algorithm's
-- limit as its ARGV and its state spell it: "period:rate".
local function window_limit(s)
  local p, r = match(s, '^(%d+):(%d+)$')
  return num(p), num(r)
end

-- The token bucket limits this script call has parsed, by their spelling:
-- the calls of a batch, and a call's reads and writes, mostly share one.
local tb_limits = {}

-- tb_limit returns the unit, per and cap of a token bucket's limit as its
-- ARGV and its state spell it: "unit:per:cap", parsed once per script call.
local function tb_limit(s)
  local l = tb_limits[s]
  if not l then
    local u, p, c = match(s, '^(%d+):(%d+):(%d+)$')
    l = {num(u), num(p), num(c)}
    tb_limits[s] = l
  end
  return l[1], l[2], l[3]
end

-- bucket_get returns the level k (negative in debt: tokenbucket.lua's
-- settle), r, the time ts (µs of the last write),
-- the limit lim ("unit:per:cap") and the rest of the token bucket at key,
-- stored as "k:r:ts:unit:per:cap" then rest: ledger.lua's ledger, which
-- begins with '|' ('' for none). It returns nil when the key is absent
-- (tokenbucket.lua and ledger.lua say what that means).
local function bucket_get(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local k, r, ts, lim, rest = match(v, '^(%-?%d+):(%d+):(%d+):([^|]+)(.*)$')
  return num(k), num(r), num(ts), lim, rest
end

-- wait_us returns the µs level k, r takes to reach m tokens at per units a
-- µs (0 when it holds them): ceil(((m - k)·unit - r) / per), through
-- muldiv. It is below 2^52 for m up to capacity and k down to -capacity
-- (twice tierlimit.MaxFill).
local function wait_us(k, r, m, unit, per)
  if k >= m then return 0 end
  return (muldiv(m - k - 1, unit, unit - r + per - 1, per))
end

-- fill returns level k, r after e µs of refill, up to ceil tokens (a level
-- already at or above ceil stays; e <= 0 adds nothing). A level that
-- reaches ceil is ceil whole tokens.
local function fill(k, r, e, unit, per, ceil)
  if e <= 0 or k >= ceil then return k, r end
  if e >= wait_us(k, r, ceil, unit, per) then return ceil, 0 end
  local q, nr = muldiv(e, per, r, unit)
  return k + q, nr
end

-- bucket_convert returns the level k, r and time ts of a bucket written
-- under the limit old ("unit:per:cap") as a bucket of unit and cap: refilled
-- under old up to now (to at most old's capacity less held, the tokens a
-- lease ledger holds), then its whole tokens kept up to cap, as
-- x/time/rate's SetLimit keeps them, and its part of a token scaled to
-- unit (rounded down: a conversion never adds); a debt is kept down to
-- -cap. ts becomes the later of ts
-- and now: the refill up to now is done.
local function bucket_convert(k, r, ts, old, now, unit, cap, held)
  local ou, op, oc = tb_limit(old)
  k, r = fill(k, r, now - ts, ou, op, oc - held)
  ts = max(ts, now)
  if k >= cap then return cap, 0, ts end
  if k < -cap then return -cap, 0, ts end -- debt past the new capacity
  return k, (muldiv(r, unit, 0, ou)), ts
end

-- bucket_put stores level k, r at time ts, written under the limit lim
-- ("unit:per:cap"), then rest (as bucket_get's; nil for none), in the
-- bucket at key with a TTL of at least us µs, or deletes the key when k is
-- cap and rest is empty: an absent key is full.
local function bucket_put(key, k, r, ts, cap, us, lim, rest)
  if k >= cap and (not rest or rest == '') then
    redis.call('DEL', key)
  else
    put(key, format('%d:%d:%d:', k, r, ts) .. lim .. (rest or ''), us)
  end
end
