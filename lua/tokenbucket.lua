-- tokenbucket.lua: token buckets, one per entry (a user key under one of
-- its limits), decided all-or-nothing, partly granted, or settled. The
-- hybrid tier's leases are ledger.lua's, on the same state.
--
-- KEYS[i]   entry i's string "k:r:ts:unit:per:cap" (bucket_get in lib.lua):
--           the level is k tokens and r/unit of one more (k < 0: debt),
--           ts = µs of the last write, and unit:per:cap the limit it was
--           written under. An absent key is a full bucket. The records of a
--           lease ledger that may follow (ledger.lua) are kept as they are,
--           and as long.
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   mode: "0" decides, "1" settles, "2" grants part (see below)
-- ARGV[1+2i], ARGV[2+2i] entry i's cost (in settle mode a signed change)
--           and limit "unit:per:cap": unit (units per token), per (units
--           refilled per µs), cap (capacity in tokens)
--
-- Reply: {allowed, granted, then per entry: remaining, retry_us, reset_us}
-- (granted is 0 but in mode "2", and in mode "1" what was left uncharged,
-- below; remaining is k, negative in debt: the caller reports at least 0).
-- Deciding, allowed is 1 when every entry has its cost (a cost of 0: when
-- no entry is in debt); retry_us is the wait after which it has (0 when
-- allowed); reset_us the wait until full. Both are exact: the first µs at
-- which the refill reaches them, the debt counted. Settling, a positive
-- cost takes tokens, below empty into debt if the level lacks them, down
-- to -cap at most (a key in debt is denied until the refill repays it), a
-- negative one gives them back up to full at most; it is never denied.
-- What the floor cuts off a cost, cost - (k + cap) with k the whole tokens
-- before, is uncharged: the reply's granted is the most of any entry.
-- Granting part (AllowAtMost, every entry's cost the same n >= 1): granted
-- is the least of n and every entry's whole tokens, taken from every entry,
-- allowed 1; when some entry holds less than one whole token (a part of
-- one, or debt), granted is 0, allowed 0, nothing is taken and retry_us is
-- the exact wait for one whole token.
--
-- A state written under another limit is refilled under that limit up to
-- now and converted (bucket_convert in lib.lua): its tokens are kept,
-- capped at the new capacity, and the call writes it under the new one.
--
-- A clock behind an entry's ts (the server's stepped back, or client clocks
-- disagree): that entry is decided at ts, as if no time had passed, and a
-- write stores ts again, so no interval is refilled twice and no state is
-- dated after the decision that wrote it; its waits and TTL count from the
-- clock the call read.
--
-- Invariants: -cap <= k <= cap (the level k + r/unit >= -cap), 0 <= r <
-- unit, and r = 0 when k = cap; a denied call charges nothing; every written key has a TTL of at least reset_us (when it expires the
-- bucket is full, which is what an absent key means).
local now = now_us()
local settle = ARGV[2] == '1'
local partial = ARGV[2] == '2'
local n = (#ARGV - 2) / 2

-- Per entry i: lk[i], lr[i] its level after refill, lag[i] how far its
-- decision's time is ahead of now, dirty[i] whether it must be written
-- whatever the decision (a conversion).
local lk, lr, lag, cost, lim, dirty, rest = {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  cost[i], lim[i] = tonumber(ARGV[1 + 2 * i]), ARGV[2 + 2 * i]
  local unit, per, cap = tb_limit(lim[i])
  local k, r, ts, old
  k, r, ts, old, rest[i] = bucket_get(KEYS[i])
  if not k then
    k, r, ts = cap, 0, now
  elseif old ~= lim[i] then
    k, r, ts = bucket_convert(k, r, ts, old, now, unit, cap, 0)
    dirty[i] = true
  end
  k, r = fill(k, r, now - ts, unit, per, cap)
  lk[i], lr[i], lag[i] = k, r, math.max(ts - now, 0)
  if not settle and not partial and k < cost[i] then allowed = 0 end
end

-- Granting part: every entry is then decided for the grant (or, when it
-- is none, for one token, which sets retry_us).
local granted = 0
if partial then
  granted = cost[1]
  for i = 1, n do granted = math.min(granted, lk[i]) end
  granted = math.max(granted, 0)
  if granted < 1 then allowed = 0 end
  for i = 1, n do cost[i] = math.max(granted, 1) end
end

local reply = {allowed, granted}
local uncharged = 0
for i = 1, n do
  local unit, per, cap = tb_limit(lim[i])
  local k, r = lk[i], lr[i]
  local take = 0
  if settle then
    take = cost[i]
  elseif allowed == 1 then
    take = cost[i]
  end
  if take < 0 and k - take >= cap then
    k, r = cap, 0
  elseif k - take < -cap then
    uncharged = math.max(uncharged, take - (k + cap))
    k, r = -cap, 0 -- the deepest debt
  else
    k = k - take
  end
  local reset = lag[i] + wait_us(k, r, cap, unit, per)
  if take ~= 0 or dirty[i] then
    -- A lease ledger's records (ledger.lua) live until their last
    -- deadline, hi, at least.
    local life = reset
    local hi = rest[i] and string.match(rest[i], '^|%d+:%d+:(%d+)')
    if hi then life = math.max(life, tonumber(hi) - now) end
    bucket_put(KEYS[i], k, r, now + lag[i], cap, life, lim[i], rest[i])
  end
  local retry = 0
  if allowed == 0 and k < cost[i] then
    retry = lag[i] + wait_us(k, r, cost[i], unit, per)
  end
  reply[#reply + 1] = k
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
if settle then reply[2] = uncharged end
return reply
