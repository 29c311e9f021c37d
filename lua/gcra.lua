-- gcra.lua: generic cell rate algorithm, one TAT per entry (a user key under
-- one of its limits), decided all-or-nothing or settled. One rational per
-- entry: the theoretical arrival time (TAT), in µs and a remainder, so that
-- the emission interval T = Period/Rate is exact whatever Rate is (T =
-- unit/per µs, tierlimit.Limit.Scale).
--
-- KEYS[i]   entry i's string "tat:f:lim": TAT = tat + f/per µs, 0 <= f <
--           per, written under the limit lim. Absent means TAT <= now
--           (full).
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   mode: "0" decides, "1" settles, "2" grants part (see below)
-- ARGV[1+2i], ARGV[2+2i] entry i's cost (0 peeks; in settle mode a signed
--           change) and limit "unit:per:ti:tf:cap": T = unit/per µs, the
--           tolerance tau = cap × T as ti + tf/per µs (0 <= tf < per), cap
--           the capacity in tokens
--
-- Reply: {allowed, granted, then per entry: remaining, retry_us, reset_us}
-- (granted: in mode "1", what was left uncharged, below).
--
-- A request of cost n >= 0 is allowed by entry i when max(TAT, now) + n·T -
-- now <= tau (a cost of 0 peeks: allowed unless TAT is past now + tau, a
-- key in debt, or one that a clock behind the last write's sees so). n·T, and remaining = floor((now + tau - TAT) / T) (0 when
-- TAT is past now + tau), go through muldiv (lib.lua): exact where n ×
-- unit passes 2^53. retry_us is the first µs at which the request fits,
-- the debt counted; reset_us the µs until TAT.
-- Settling moves TAT by n·T, forward at most to now + 2·tau (a level of
-- -cap: debt, which a refill repays before anything is admitted), back at
-- most to now (full); it is never denied. What that bound cuts off a cost,
-- cost - (k + cap) with k the level's whole tokens (debt rounded up), is
-- uncharged: the reply's granted is the most of any entry.
-- Granting part (AllowAtMost, every entry's cost the same n >= 1): granted
-- is the least of n and every entry's remaining, and TAT moves by
-- granted·T, allowed 1; when some entry has no whole token left, granted
-- is 0, allowed 0, nothing moves and retry_us is the wait for one.
--
-- A state written under another limit: its whole tokens at now under that
-- limit are kept, capped at cap, and TAT becomes now + (cap - tokens)·T of
-- the new limit (the part of a token is dropped: a conversion never adds);
-- a debt is kept the same way, in whole tokens rounded up, down to -cap;
-- the call writes it.
--
-- Invariants: 0 <= f < per; a denied call charges nothing; a written TAT
-- expires when it passes (an expired key reads as TAT <= now, the same
-- state).
local now = now_us()
local settle = ARGV[2] == '1'
local partial = ARGV[2] == '2'
local uncharged = 0 -- settling: the most an entry's bound cut off

-- carry returns x + xf/per with 0 <= xf < per, for 0 <= xf < 2·per.
local function carry(x, xf, per)
  if xf >= per then return x + 1, xf - per end
  return x, xf
end

-- gcra_limit returns unit, per, ti, tf and cap of a limit string.
local function gcra_limit(s)
  local a, b, c, d, e = string.match(s, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e)
end

-- tokens returns floor((now + ti + tf/per - (v + f/per)) / (unit/per)): the
-- whole tokens a TAT of v + f/per leaves at now (0 when none).
local function tokens(v, f, unit, per, ti, tf)
  local e, g = now + ti - v, tf - f
  if g < 0 then e, g = e - 1, g + per end
  if e < 0 then return 0 end
  return (muldiv(e, per, g, unit))
end

-- owed returns ceil((v + f/per - (now + ti + tf/per)) / (unit/per)): the
-- whole tokens, rounded up, of the debt a TAT of v + f/per leaves at now
-- (0 when it is not past now + tau).
local function owed(v, f, unit, per, ti, tf)
  local a, b = v - now - ti, f - tf
  if b < 0 then a, b = a - 1, b + per end
  if a < 0 then return 0 end
  local q, r = muldiv(a, per, b, unit)
  if r > 0 then q = q + 1 end
  return q
end

-- later returns v + f/per plus m·T (unit/per µs), m >= 0.
local function later(v, f, m, unit, per)
  local q, r = muldiv(m, unit, 0, per)
  return carry(v + q, f + r, per)
end

local n = #KEYS
local tat, frac, nt, nf, unit, per, ti, tf, cap, cost, lim, dirty = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  cost[i], lim[i] = tonumber(ARGV[1 + 2 * i]), ARGV[2 + 2 * i]
  unit[i], per[i], ti[i], tf[i], cap[i] = gcra_limit(lim[i])
  local v, f, old = pair_get(KEYS[i])
  if v == nil or v < now then
    v, f = now, 0
  elseif old ~= lim[i] then
    local ou, op, oi, of, oc = gcra_limit(old)
    -- Whole tokens, or whole tokens of debt rounded up: a conversion
    -- never adds. Either is capped at cap.
    local left = math.min(tokens(v, f, ou, op, oi, of), cap[i]) - math.min(owed(v, f, ou, op, oi, of), cap[i])
    v, f = later(now, 0, cap[i] - left, unit[i], per[i])
    dirty[i] = true
  end
  tat[i], frac[i] = v, f
  if settle then
    local c = cost[i]
    if c >= 0 then
      -- At most to now + 2·tau: TAT + c·T, the level less c, floored at
      -- -cap; never back (a clock behind the last write's may see TAT
      -- past now + 2·tau already).
      local k = math.min(tokens(v, f, unit[i], per[i], ti[i], tf[i]), cap[i]) - owed(v, f, unit[i], per[i], ti[i], tf[i])
      uncharged = math.max(uncharged, math.min(c, c - (k + cap[i])))
      local x, xf = later(v, f, c, unit[i], per[i])
      local lt, lf = carry(now + 2 * ti[i], 2 * tf[i], per[i])
      if lt < v or lt == v and lf < f then lt, lf = v, f end
      if x > lt or x == lt and xf > lf then x, xf = lt, lf end
      nt[i], nf[i] = x, xf
    else
      local m = math.min(-c, cap[i])
      local q, r = muldiv(m, unit[i], 0, per[i])
      local x, xf = v - q, f - r
      if xf < 0 then x, xf = x - 1, xf + per[i] end
      if x < now then x, xf = now, 0 end
      nt[i], nf[i] = x, xf
    end
  elseif not partial then
    -- The TAT after this request: TAT + n·T.
    nt[i], nf[i] = later(v, f, cost[i], unit[i], per[i])
    local d = nt[i] - now
    if d > ti[i] or d == ti[i] and nf[i] > tf[i] then allowed = 0 end
  end
end

-- Granting part: every entry is then decided for the grant (or, when it
-- is none, for one token, which sets retry_us).
local granted = 0
if partial then
  granted = cost[1]
  for i = 1, n do granted = math.min(granted, tokens(tat[i], frac[i], unit[i], per[i], ti[i], tf[i])) end
  if granted < 1 then allowed = 0 end
  for i = 1, n do
    cost[i] = math.max(granted, 1)
    nt[i], nf[i] = later(tat[i], frac[i], cost[i], unit[i], per[i])
  end
end

local reply = {allowed, granted}
for i = 1, n do
  local v, f = tat[i], frac[i]
  local retry = 0
  local d = nt[i] - now
  if allowed == 1 then
    if nt[i] ~= v or nf[i] ~= f then dirty[i] = true end
    v, f = nt[i], nf[i]
  elseif d > ti[i] or d == ti[i] and nf[i] > tf[i] then
    retry = d - ti[i]
    if nf[i] > tf[i] then retry = retry + 1 end
  end
  local reset = v - now
  if f > 0 then reset = reset + 1 end
  if dirty[i] then
    if reset > 0 then
      put(KEYS[i], string.format('%d:%d:', v, f) .. lim[i], reset)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  reply[#reply + 1] = tokens(v, f, unit[i], per[i], ti[i], tf[i])
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
if settle then reply[2] = uncharged end
return reply
