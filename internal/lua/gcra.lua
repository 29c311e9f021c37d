-- gcra.lua: generic cell rate algorithm over one or more limits,
-- all-or-nothing. One rational per limit: the theoretical arrival time
-- (TAT), in µs and a remainder, so that the emission interval T =
-- Period/Rate is exact whatever Rate is (T = unit/per µs, tierlimit.Limit.Scale).
--
-- KEYS[i]   string "tat:f" of limit i: TAT = tat + f/per µs, 0 <= f < per.
--           Absent means TAT <= now (full).
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   n: cost (0 peeks)
-- ARGV[2+4(i-1)+1..4] for limit i: unit, per (T = unit/per µs), and the
--           tolerance tau = capacity × T as ti + tf/per µs (0 <= tf < per)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
--
-- A request of cost n is allowed by limit i when max(TAT, now) + n·T - now
-- <= tau. n·T, and remaining = floor((now + tau - TAT) / T), go through
-- muldiv (lib.lua): exact where n × unit passes 2^53. retry_us is the
-- first µs at which the request fits; reset_us the µs until TAT.
-- Invariants: 0 <= f < per; a denied call writes nothing; a written TAT
-- expires when it passes (an expired key reads as TAT <= now, the same
-- state).
local now = now_us()
local cost = tonumber(ARGV[2])

-- carry returns x + xf/per with 0 <= xf < per, for 0 <= xf < 2·per.
local function carry(x, xf, per)
  if xf >= per then return x + 1, xf - per end
  return x, xf
end

local n = #KEYS
local tat, frac, nt, nf, unit, per, ti, tf = {}, {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 4
  unit[i], per[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  ti[i], tf[i] = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local v, f = pair_get(KEYS[i])
  if v == nil or f == nil or v < now then v, f = now, 0 end
  tat[i], frac[i] = v, f
  -- The TAT after this request: TAT + n·T.
  local q, r = muldiv(cost, unit[i], 0, per[i])
  nt[i], nf[i] = carry(v + q, f + r, per[i])
  local d = nt[i] - now
  if d > ti[i] or d == ti[i] and nf[i] > tf[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local v, f = tat[i], frac[i]
  local retry = 0
  local d = nt[i] - now
  if allowed == 1 then
    v, f = nt[i], nf[i]
    if cost > 0 then
      local left = v - now
      if f > 0 then left = left + 1 end
      put(KEYS[i], string.format('%d:%d', v, f), left)
    end
  elseif d > ti[i] or d == ti[i] and nf[i] > tf[i] then
    retry = d - ti[i]
    if nf[i] > tf[i] then retry = retry + 1 end
  end
  -- now + tau - TAT, as e + g/per µs, in tokens of T.
  local e, g = now + ti[i] - v, tf[i] - f
  if g < 0 then e, g = e - 1, g + per[i] end
  local remaining = 0
  if e >= 0 then remaining = muldiv(e, per[i], g, unit[i]) end
  local reset = v - now
  if f > 0 then reset = reset + 1 end
  reply[#reply + 1] = remaining
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
