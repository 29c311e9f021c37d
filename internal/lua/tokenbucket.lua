-- tokenbucket.lua: token bucket over one or more limits, all-or-nothing; also
-- the lease primitive of the hybrid tier (claim between min and want tokens,
-- after refunding unspent ones).
--
-- KEYS[i]   string "s:ts" of limit i (bucket_get in lib.lua): s = level in
--           units, ts = µs of the last write. An absent key is a full bucket.
-- KEYS[n+1] optional, n = the number of limits: the marker of an idempotent
--           refund (once in lib.lua).
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
-- A clock behind a limit's ts (the server's stepped back, or client clocks
-- disagree): that limit is decided at ts, as if no time had passed, and a
-- write stores ts again, so no interval is refilled twice and no state is
-- dated after the decision that wrote it; its waits and TTL count from the
-- clock the call read.
--
-- Invariants: 0 <= s <= cap; a denied call writes nothing (the refund, if
-- any, is still applied); every written key has a TTL of at least reset_us
-- (when it expires the bucket is full, which is what an absent key means).
local now = now_us()
local min, want, refund = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = (#ARGV - 4) / 3
if refund > 0 and not once(KEYS[n + 1]) then
  refund = 0 -- this refund ran already
end

-- Per limit i: lvl[i] its level after refill and refund, lag[i] how far its
-- decision's time is ahead of now.
local lvl, lag = {}, {}
local grant = want
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local s, ts = bucket_get(KEYS[i])
  if not s then s, ts = cap, now end
  s = fill(s, now - ts, per, cap)
  if refund > 0 then s = math.min(cap, s + refund * unit) end
  lvl[i], lag[i] = s, math.max(ts - now, 0)
  local avail = idiv(s, unit)
  if avail < grant then grant = avail end
end

local allowed = 1
if grant < min then
  grant, allowed = 0, 0
end

local reply = {allowed, grant}
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local s = lvl[i] - grant * unit
  local reset = lag[i] + cdiv(cap - s, per)
  if grant > 0 or refund > 0 then
    bucket_put(KEYS[i], s, now + lag[i], cap, reset)
  end
  local retry = 0
  if allowed == 0 and s < min * unit then
    retry = lag[i] + cdiv(min * unit - s, per)
  end
  reply[#reply + 1] = idiv(s, unit)
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
