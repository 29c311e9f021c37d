-- tokenbucket.lua: token bucket over one or more limits, all-or-nothing; also
-- the lease primitive of the hybrid tier (claim between min and want tokens,
-- after refunding unspent ones).
--
-- KEYS[i]   string "k:r:ts" of limit i (bucket_get in lib.lua): the level is
--           k tokens and r/unit of one more, ts = µs of the last write. An
--           absent key is a full bucket.
-- KEYS[n+1] optional, n = the number of limits: the marker of an idempotent
--           refund (once in lib.lua).
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   min: tokens required; fewer available denies and charges nothing
-- ARGV[3]   want: tokens to take at most (>= min)
-- ARGV[4]   refund: tokens given back before claiming (capped at capacity)
-- ARGV[4+3(i-1)+1..3] for limit i: unit (units per token), per (units
--           refilled per µs), cap (capacity in tokens)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- allowed is 1 when granted >= min. retry_us is the wait after which min
-- tokens are available (0 when allowed); reset_us the wait until full. Both
-- are exact: the first µs at which the refill reaches them.
--
-- A clock behind a limit's ts (the server's stepped back, or client clocks
-- disagree): that limit is decided at ts, as if no time had passed, and a
-- write stores ts again, so no interval is refilled twice and no state is
-- dated after the decision that wrote it; its waits and TTL count from the
-- clock the call read.
--
-- Invariants: 0 <= k <= cap, 0 <= r < unit, and r = 0 when k = cap; a
-- denied call writes nothing (the refund, if any, is still applied); every
-- written key has a TTL of at least reset_us (when it expires the bucket is
-- full, which is what an absent key means).
local now = now_us()
local min, want, refund = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = (#ARGV - 4) / 3
if refund > 0 and not once(KEYS[n + 1]) then
  refund = 0 -- this refund ran already
end

-- Per limit i: lk[i], lr[i] its level after refill and refund, lag[i] how
-- far its decision's time is ahead of now.
local lk, lr, lag = {}, {}, {}
local grant = want
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local k, r, ts = bucket_get(KEYS[i])
  if not k then k, r, ts = cap, 0, now end
  k, r = fill(k, r, now - ts, unit, per, cap)
  if refund > 0 and k + refund >= cap then
    k, r = cap, 0
  elseif refund > 0 then
    k = k + refund
  end
  lk[i], lr[i], lag[i] = k, r, math.max(ts - now, 0)
  if k < grant then grant = k end
end

local allowed = 1
if grant < min then
  grant, allowed = 0, 0
end

local reply = {allowed, grant}
for i = 1, n do
  local a = 4 + (i - 1) * 3
  local unit, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local k, r = lk[i] - grant, lr[i]
  local reset = lag[i] + wait_us(k, r, cap, unit, per)
  if grant > 0 or refund > 0 then
    bucket_put(KEYS[i], k, r, now + lag[i], cap, reset)
  end
  local retry = 0
  if allowed == 0 and k < min then
    retry = lag[i] + wait_us(k, r, min, unit, per)
  end
  reply[#reply + 1] = k
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
