-- ledger.lua: the token bucket of tokenbucket.lua, one limit, with a ledger
-- of the tokens holders (hybrid instances) have leased and may still spend.
-- The bucket refills only up to capacity minus what the ledger holds, so
-- that the level plus the tokens held never exceed the capacity: a fleet
-- then admits, over any interval T, at most capacity + rate·T, as one bucket
-- would, whatever it held when the interval began. The bucket's state,
-- refill and write are lib.lua's (bucket_get, fill, bucket_put).
--
-- KEYS[1]  string "k:r:ts:unit:per:cap", as tokenbucket.lua's: the level
--          is k tokens and r/unit of one more, ts = µs of the last write,
--          unit:per:cap the limit it was written under. An absent key is a
--          bucket full up to what the ledger leaves.
-- KEYS[2]  hash holder -> "held:gen:deadline:grant": tokens the holder may
--          still spend (an upper bound), the number of its last claim, the µs
--          after which it spends none of them (it promises to stop before),
--          and what its last claim handed out (granted and recovered).
-- KEYS[3]  optional: the marker of an idempotent refund (once in lib.lua).
-- ARGV[1]  client clock in µs, or 0 for TIME
-- ARGV[2]  min: tokens required; fewer available denies and grants nothing
-- ARGV[3]  want: tokens to take at most (>= min)
-- ARGV[4]  refund: tokens the holder gives back (it holds none after)
-- ARGV[5]  the limit "unit:per:cap": unit (units per token), per (units
--          refilled per µs), cap (capacity in tokens)
-- ARGV[6]  hold: µs from a grant to the holder's deadline
-- ARGV[7]  gen: the claim's number (claims of a holder are numbered in
--          order), or for a refund the number of the last claim before it
-- ARGV[8]  held: for a claim, the tokens the holder still holds as it sends
--          it (an upper bound); -1 for a call that is not a holder's claim
-- ARGV[9]  holder, or '' for a call that holds nothing (AllowN)
-- ARGV[10] optional: orphan, the number of the holder's first claim whose
--          reply it never got, none of the later ones' either (0: none);
--          Redis may have run them (a refund may give back nothing but an
--          orphan's grant)
--
-- Reply: as tokenbucket.lua, {allowed, granted, remaining, retry_us,
-- reset_us}; remaining is the level, what a claim could take now. A claim
-- that names an orphan its entry shows was run (the entry's number is the
-- orphan's or later) is granted again what the entry's claim handed out
-- (its grant and what it recovered in turn), without taking it again:
-- granted counts it, and min counts it first.
--
-- A state written under another limit is refilled under it up to now, to
-- at most its capacity less every token the ledger holds, and converted
-- (bucket_convert in lib.lua): its tokens kept, capped at the new capacity.
--
-- A clock behind ts: the call is decided at ts, as tokenbucket.lua
-- decides, deadlines included; waits and TTLs count from the clock the call
-- read.
--
-- Invariants, with O the tokens the ledger holds: k + O <= cap after every
-- call, r < unit, and r = 0 when k + O = cap; the level rises by at most
-- per units a µs of elapsed time, whatever the ledger does (a holder's
-- deadline passing raises the ceiling, not the level); a denied call grants nothing; every key has a TTL, and the state
-- lives until the bucket is full after the ledger's last deadline.
local clock = now_us()
local min, want, refund = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lim = ARGV[5]
local unit, per, cap = tb_limit(lim)
local hold, gen, held, holder = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local orphan = tonumber(ARGV[10] or 0)
if refund > 0 and not once(KEYS[3]) then
  refund = 0 -- this refund ran already
end
local k, r, ts, old = bucket_get(KEYS[1])
local now = clock
if ts and ts > now then now = ts end
local dirty = false

-- The ledger: live entries, and those past their deadline in time order.
local total, maxd = 0, 0 -- tokens of every entry; latest live deadline
local mine               -- {held, gen, deadline, grant} of holder's live entry
local gone, dead = {}, {}
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local h, g, d, last = string.match(raw[i + 1], '^(%d+):(%d+):(%d+):(%d+)$')
  h, g, d, last = tonumber(h), tonumber(g), tonumber(d), tonumber(last)
  total = total + h
  if d <= now then
    gone[#gone + 1] = raw[i]
    dead[#dead + 1] = {d, h}
  else
    if d > maxd then maxd = d end
    if raw[i] == holder then mine = {h, g, d, last} end
  end
end

-- Refill up to now, the ceiling rising at each deadline passed.
if k and old ~= lim then
  k, r, ts = bucket_convert(k, r, ts, old, now, unit, cap, total)
  dirty = true
end
if not k then
  k, r, ts = math.max(cap - total, 0), 0, now
elseif k >= cap - total then
  k, r = math.max(cap - total, 0), 0
end
if #dead > 1 then table.sort(dead, function(a, b) return a[1] < b[1] end) end
for _, x in ipairs(dead) do
  if x[1] > ts then
    k, r = fill(k, r, x[1] - ts, unit, per, cap - total)
    ts = x[1]
  end
  total = total - x[2]
end
k, r = fill(k, r, now - ts, unit, per, cap - total)
if #gone > 0 then
  dirty = true
  redis.call('HDEL', KEYS[2], unpack(gone))
end

-- A claim whose reply the holder never got, and that ran: what it granted
-- is in the holder's entry, not in the holder's hands. Hand it over.
-- A refund gives it back with the rest.
local recovered = 0
if orphan > 0 and holder ~= '' and mine and mine[2] >= orphan then
  recovered = math.min(mine[4], mine[1])
  if held < 0 then
    -- A refund covers the claims numbered up to its own: a later claim's
    -- entry, and what it handed out, is the later claim's.
    if mine[2] > gen then recovered = 0 end
    refund, recovered = refund + recovered, 0
  else
    held = held + recovered
    min = math.max(min - recovered, 0)
  end
end

-- The holder's report: a refund ends its entry (unless a later claim wrote
-- it); a claim lowers it to what the holder says it still holds.
local keep = 0 -- what holder's entry holds before this call's grant
if mine then keep = mine[1] end
if refund > 0 then
  if mine and mine[2] <= gen then
    total, keep, mine = total - keep, 0, nil
    redis.call('HDEL', KEYS[2], holder)
  end
  if k + refund >= cap - total then
    k, r = math.max(cap - total, 0), 0
  else
    k = k + refund
  end
  dirty = true
elseif mine and held >= 0 and held < keep then
  total, keep = total - keep + held, held
end

local grant = want
if k < grant then grant = k end
local allowed = 1
if grant < min then grant, allowed = 0, 0 end
k = k - grant
if holder ~= '' and held >= 0 and (grant > 0 or mine) then
  if grant > 0 then
    local d = now + hold
    if d > maxd then maxd = d end
    redis.call('HSET', KEYS[2], holder, string.format('%d:%d:%d:%d', keep + grant, gen, d, grant + recovered))
  elseif keep > 0 then
    redis.call('HSET', KEYS[2], holder, string.format('%d:%d:%d:%d', keep, gen, mine[3], recovered))
  else
    redis.call('HDEL', KEYS[2], holder)
  end
  total = total + grant
  dirty = true
end
if grant > 0 then dirty = true end

local lag = now - clock
local reset = lag + wait_us(k, r, cap, unit, per)
if dirty then
  if total > 0 then expire_us(KEYS[2], maxd - clock) end
  -- The level only rises until a grant rewrites the state: full by the
  -- last deadline plus reset, when the absent key means a full bucket.
  local life = reset
  if total > 0 then life = maxd - now + reset end
  bucket_put(KEYS[1], k, r, now, cap, life, lim)
end
local retry = 0
if allowed == 0 then retry = lag + wait_us(k, r, min, unit, per) end
return {allowed, grant + recovered, k, retry, reset}
