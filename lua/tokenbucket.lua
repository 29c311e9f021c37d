-- tokenbucket.lua: token bucket over one or more limits, all-or-nothing; also
-- the lease primitive of the hybrid tier (claim between min and want tokens,
-- after refunding unspent ones).
--
-- KEYS[i]   string "s:ts" of limit i: s = level in units, ts = µs of the
--           last write. An absent key is a full bucket.
-- KEYS[n+1] optional, n = the number of limits: the marker of an idempotent
--           refund. The refund is applied only if the marker did not exist;
--           it then exists for 30 s. go-redis retries a command whose
--           connection broke, and a refund that ran before the break must
--           not run twice: that would mint tokens.
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   min: tokens required; fewer available denies and charges nothing
-- ARGV[3]   want: tokens to take at most (>= min)
-- ARGV[4]   refund: tokens given back before claiming (capped at capacity)
-- ARGV[4+3(i-1)+1..3] for limit i: unit (units per token), per (units
--           refilled per µs), cap (capacity × unit)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- allowed is 1 when granted >= min. retry_us is the wait after which min
-- tokens are available (0 when allowed); reset_us the wait until full.
--
-- Invariants: 0 <= s <= cap; a denied call writes nothing (the refund, if
-- any, is still applied); every written key has a TTL of at least reset_us
-- (when it expires the bucket is full, which is what an absent key means).
local now = now_us()
local min, want, refund = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

-- One limit and no refund marker: the common call, straight-line (no
-- tables, no loops; a third less server time than the general path below,
-- which it must agree with: remote's TestTokenBucketPathsAgree).
if #ARGV == 7 and #KEYS == 1 then
  local unit, per, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local s, ts = cap, now
  local v = redis.call('GET', KEYS[1])
  if v then
    local x, y = string.match(v, '^(%d+):(%d+)$')
    s, ts = tonumber(x), tonumber(y)
    local e = now - ts
    if e > 0 then
      s = s + e * per -- beyond 2^53 only when far above cap: capped exactly
      if s > cap then s = cap end
    elseif ts > now then
      now = ts -- a server clock that stepped back must not refill twice
    end
  end
  if refund > 0 then
    s = s + refund * unit
    if s > cap then s = cap end
  end
  local avail = idiv(s, unit)
  local grant = want
  if avail < grant then grant = avail end
  if grant < min then
    if refund > 0 then
      if s >= cap then redis.call('DEL', KEYS[1]) else
        redis.call('SET', KEYS[1], string.format('%d:%d', s, now), 'PX', ttl_ms(cdiv(cap - s, per))) end
    end
    return {0, 0, avail, cdiv(min * unit - s, per), cdiv(cap - s, per)}
  end
  s = s - grant * unit
  local reset = cdiv(cap - s, per)
  if grant > 0 or refund > 0 then
    if s >= cap then redis.call('DEL', KEYS[1]) else
      redis.call('SET', KEYS[1], string.format('%d:%d', s, now), 'PX', ttl_ms(reset)) end
  end
  return {1, grant, idiv(s, unit), 0, reset}
end

-- The general path: several limits, or an idempotent refund.
local n = (#ARGV - 4) / 3
if refund > 0 and KEYS[n + 1] and not redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', 30000) then
  refund = 0 -- this refund ran already
end
-- Per limit i, flat: lvl[i] level after refill and refund, last[i] time.
local lvl, last = {}, {}
local grant = want
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local s, ts = cap, now
  local v = redis.call('GET', KEYS[i])
  if v then
    local x, y = string.match(v, '^(%d+):(%d+)$')
    s, ts = tonumber(x), tonumber(y)
    local e = now - ts
    if e >= cdiv(cap, per) then
      s = cap
    elseif e > 0 then
      s = math.min(cap, s + e * per)
    end
    -- A server clock that stepped back must not refill twice.
    if ts < now then ts = now end
  end
  if refund > 0 then s = math.min(cap, s + refund * unit) end
  lvl[i], last[i] = s, ts
  local avail = idiv(s, unit)
  if avail < grant then grant = avail end
end

local allowed = 1
if grant < min then
  grant, allowed = 0, 0
end

local reply = {allowed, grant}
local r = 2
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local s = lvl[i] - grant * unit
  local reset = cdiv(cap - s, per)
  if grant > 0 or refund > 0 then
    if s >= cap then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], string.format('%d:%d', s, last[i]), 'PX', ttl_ms(reset))
    end
  end
  local retry = 0
  if allowed == 0 and s < min * unit then
    retry = cdiv(min * unit - s, per)
  end
  reply[r + 1], reply[r + 2], reply[r + 3] = idiv(s, unit), retry, reset
  r = r + 3
end
return reply
