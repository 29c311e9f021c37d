-- tokenbucket.lua: token bucket over one or more limits, all-or-nothing; also
-- the lease primitive of the hybrid tier (claim between min and want tokens,
-- after refunding unspent ones).
--
-- KEYS[i]   string "s:ts" of limit i: s = level in units, ts = µs of the
--           last write. An absent key is a full bucket.
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
local n = #KEYS
local lvl, last, unit, per, cap = {}, {}, {}, {}, {}
local grant = want
for i = 1, n do
  local a = 4 + (i - 1) * 3
  unit[i], per[i], cap[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local full = cdiv(cap[i], per[i])
  local st = fields(redis.call('GET', KEYS[i]))
  local s, ts
  if st then s, ts = st[1], st[2] end
  if s == nil or ts == nil then
    s, ts = cap[i], now
  else
    local e = now - ts
    if e >= full then
      s = cap[i]
    elseif e > 0 then
      s = math.min(cap[i], s + e * per[i])
    end
    -- A server clock that stepped back must not refill twice.
    if ts < now then ts = now end
  end
  s = math.min(cap[i], s + refund * unit[i])
  lvl[i], last[i] = s, ts
  grant = math.min(grant, idiv(s, unit[i]))
end

local allowed = 1
if grant < min then
  grant, allowed = 0, 0
end

local reply = {allowed, grant}
for i = 1, n do
  local s = lvl[i] - grant * unit[i]
  if grant > 0 or refund > 0 then
    if s >= cap[i] then
      redis.call('DEL', KEYS[i])
    else
      put(KEYS[i], str(s) .. ':' .. str(last[i]), cdiv(cap[i] - s, per[i]))
    end
  end
  local retry = 0
  if allowed == 0 and s < min * unit[i] then
    retry = cdiv(min * unit[i] - s, per[i])
  end
  reply[#reply + 1] = idiv(s, unit[i])
  reply[#reply + 1] = retry
  reply[#reply + 1] = cdiv(cap[i] - s, per[i])
end
return reply
