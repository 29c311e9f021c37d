-- lib.lua: helpers prepended to every script of this package (lua.go).
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

-- expire_us gives key a TTL of at least us microseconds.
local function expire_us(key, us)
  redis.call('PEXPIRE', key, ttl_ms(us))
end

-- once reports whether the refund whose marker is key (nil: none) is to be
-- applied: only if the marker did not exist; it then exists for 30 s.
-- go-redis resends a command whose connection broke, and a refund that ran
-- before the break must not run twice: that would mint tokens.
local function once(key)
  return not key or redis.call('SET', key, '1', 'NX', 'PX', 30000) ~= false
end

-- bucket_get returns the level s (units) and time ts (µs of the last write)
-- of the token bucket at key, stored as "s:ts", or nil when the key is
-- absent (tokenbucket.lua and ledger.lua say what that means).
local function bucket_get(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local s, ts = string.match(v, '^(%d+):(%d+)$')
  return tonumber(s), tonumber(ts)
end

-- fill returns level s after e µs of refill at per units a µs, up to ceil
-- (a level already above ceil stays; e <= 0 adds nothing). s + e × per
-- passes 2^53 only when far above ceil, which min then returns exactly.
local function fill(s, e, per, ceil)
  if e <= 0 then return s end
  return math.min(math.max(ceil, s), s + e * per)
end

-- bucket_put stores level s at time ts in the bucket at key with a TTL of
-- at least us µs, or deletes the key when s is cap: an absent key is full.
local function bucket_put(key, s, ts, cap, us)
  if s >= cap then
    redis.call('DEL', key)
  else
    put(key, string.format('%d:%d', s, ts), us)
  end
end
