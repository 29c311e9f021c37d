-- slidingwindow.lua: sliding window counter, one per entry (a user key
-- under one of its limits), decided all-or-nothing, partly granted, or
-- settled. The count of the previous fixed window, weighted by how much of
-- it the sliding window still covers, plus the current window's count must
-- fit the rate.
--
-- KEYS[i]   entry i's string "w:c:pc:p:rate:q": w = current window index,
--           c = its count, pc = the previous window's count, written under
--           the limit p:rate:q
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   mode: "0" decides, "1" settles, "2" grants part (see below)
-- ARGV[1+2i], ARGV[2+2i] entry i's cost (0 peeks; in settle mode a signed
--           change) and limit "p:rate:q": period in µs, rate, q: the
--           weight's grain in µs, chosen so that rate × (period / q) stays
--           below 2^51
--
-- The previous window weighs ceil(pc × k / m), where m = floor(period / q)
-- and k = ceil((period - elapsed) / q): never less than the exact weight, so
-- the grain can only under-admit.
--
-- Reply: {allowed, granted, then per entry: remaining, retry_us, reset_us}
-- (granted: settling, the most of a positive cost an entry could not count,
-- the window being full; else as tokenbucket.lua says).
-- retry_us is exact for this arithmetic: the first µs at which the request
-- fits. Settling adds a positive cost to the current count, up to what
-- fits the rate; a negative one comes off the current count, then the
-- previous one, down to 0; it is never denied.
-- Granting part (AllowAtMost, every entry's cost the same n >= 1): granted
-- is the least of n and what every entry's window still admits, charged
-- to every entry, allowed 1; when some entry admits none, granted is 0,
-- allowed 0, nothing is charged and retry_us is the wait for one event.
-- A window keeps no debt: what Settle takes beyond the rate is forgiven.
--
-- A state written under another limit: its counts, rolled over by the old
-- period, carry over (each capped at rate) as the current and previous
-- windows of the new period; the call writes it.
--
-- A cost of 0 peeks: allowed even when a lowered rate leaves the estimate
-- above it.
--
-- Invariants: c <= rate; a denied call charges nothing; keys expire when
-- both windows they hold have passed.
local now = now_us()
local settle = ARGV[2] == '1'
local partial = ARGV[2] == '2'

-- roll returns the count of window w and of the one before, from a state
-- of window sw with counts c, pc.
local function roll(sw, c, pc, w)
  if sw == w then return c, pc end
  if sw == w - 1 then return 0, c end
  return 0, 0
end

local n = #KEYS
local cur, prev, w, p, rate, q, est, cost, lim, dirty = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  cost[i], lim[i] = tonumber(ARGV[1 + 2 * i]), ARGV[2 + 2 * i]
  local pp, rr, qq = string.match(lim[i], '^(%d+):(%d+):(%d+)$')
  p[i], rate[i], q[i] = tonumber(pp), tonumber(rr), tonumber(qq)
  w[i] = idiv(now, p[i])
  local c, pc = 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local vw, vc, vp, old = string.match(v, '^(%d+):(%d+):(%d+):(.+)$')
    if old == lim[i] then
      c, pc = roll(tonumber(vw), tonumber(vc), tonumber(vp), w[i])
    elseif old then
      local op = tonumber(string.match(old, '^(%d+)'))
      c, pc = roll(tonumber(vw), tonumber(vc), tonumber(vp), idiv(now, op))
      c, pc = math.min(c, rate[i]), math.min(pc, rate[i])
      dirty[i] = true
    end
  end
  cur[i], prev[i] = c, pc
  local m = idiv(p[i], q[i])
  local k = cdiv(p[i] - (now - w[i] * p[i]), q[i])
  est[i] = math.min(pc, cdiv(pc * k, m)) + c
  if not settle and not partial and cost[i] > 0 and est[i] + cost[i] > rate[i] then allowed = 0 end
end

-- Granting part: every entry is then decided for the grant (or, when it
-- is none, for one event, which sets retry_us).
local granted = 0
if partial then
  granted = cost[1]
  for i = 1, n do granted = math.min(granted, rate[i] - est[i]) end
  granted = math.max(granted, 0)
  if granted < 1 then allowed = 0 end
  for i = 1, n do cost[i] = math.max(granted, 1) end
end

-- fits returns the µs, from now, at which a window starting at wstart whose
-- previous window counted pc leaves room for the request; nil when that
-- window ends first (then the next window decides, with pc = this count).
local function fits(i, pc, room, wstart)
  if room < 0 then return nil end
  if pc == 0 then return math.max(0, wstart - now) end
  local m = idiv(p[i], q[i])
  local k = idiv(room * m, pc)
  if k == 0 then return nil end
  return math.max(0, wstart + math.max(0, p[i] - k * q[i]) - now)
end

local reply = {allowed, granted}
local uncharged = 0 -- settling: the most of a cost a window could not count
for i = 1, n do
  local c, pc = cur[i], prev[i]
  local retry = 0
  if settle and cost[i] >= 0 then
    local add = math.max(0, math.min(cost[i], rate[i] - est[i]))
    uncharged = math.max(uncharged, cost[i] - add)
    c = c + add
  elseif settle then
    local back = -cost[i]
    local fromc = math.min(back, c)
    c, pc = c - fromc, math.max(0, pc - (back - fromc))
  elseif allowed == 1 then
    c = c + cost[i]
  elseif cost[i] > 0 and est[i] + cost[i] > rate[i] then
    retry = fits(i, pc, rate[i] - cost[i] - c, w[i] * p[i])
    if retry == nil then
      retry = fits(i, c, rate[i] - cost[i], (w[i] + 1) * p[i]) or ((w[i] + 2) * p[i] - now)
    end
  end
  if c ~= cur[i] or pc ~= prev[i] then
    dirty[i] = true
    local m = idiv(p[i], q[i])
    local k = cdiv(p[i] - (now - w[i] * p[i]), q[i])
    est[i] = math.min(pc, cdiv(pc * k, m)) + c
  end
  if dirty[i] then
    put(KEYS[i], string.format('%d:%d:%d:', w[i], c, pc) .. lim[i], (w[i] + 2) * p[i] - now)
  end
  local reset = 0
  if c > 0 then
    reset = (w[i] + 2) * p[i] - now
  elseif pc > 0 then
    reset = (w[i] + 1) * p[i] - now
  end
  reply[#reply + 1] = rate[i] - est[i]
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
if settle then reply[2] = uncharged end
return reply
