-- lib.lua: helpers prepended to every script of this package (see lua.go).
--
-- Redis Lua numbers are float64: every value the scripts compute stays an
-- integer below 2^53 (tierlimit.Limit.Validate rejects limits that could not),
-- and divisions go through idiv/cdiv, which correct float rounding so that
-- they are exact.
--
-- ARGV[1] of every script is a client clock in microseconds, or 0 to read the
-- server clock (TIME), which is the default: app servers' clocks never decide.

local function now_us()
  local o = tonumber(ARGV[1])
  if o > 0 then return o end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- idiv returns floor(a / b) exactly for integers 0 <= a, 0 < b, a/b < 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
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

-- str formats an integer without exponent or fraction.
local function str(x)
  return string.format('%d', x)
end

-- ttl_ms returns a TTL in ms that outlasts us microseconds (at least 1 ms).
local function ttl_ms(us)
  return cdiv(math.max(us, 1), 1000) + 1
end

-- put stores a state string under key with a TTL of at least us
-- microseconds, in one command: no key of ours ever lives without a TTL.
local function put(key, value, us)
  redis.call('SET', key, value, 'PX', ttl_ms(us))
end

-- fields splits a state string "a", "a:b" or "a:b:c" into numbers (nil
-- for those absent), or returns nil for an absent key. One match: cheaper
-- than an iterator.
local function fields(v)
  if not v then return nil end
  local a, b, c = string.match(v, '^(%d+):?(%d*):?(%d*)$')
  return {tonumber(a), tonumber(b), tonumber(c)}
end

-- expire_us gives key a TTL of at least us microseconds.
local function expire_us(key, us)
  redis.call('PEXPIRE', key, ttl_ms(us))
end

