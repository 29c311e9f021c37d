-- anchoredwindow.lua: fixed windows that start at a key's first admitted
-- hit and last one period, one per entry (a user key under one of its
-- limits), decided all-or-nothing, partly granted, or settled.
--
-- KEYS[i]   entry i's string "s:c:p:rate": s = µs the window started, c =
--           count, written under the limit p:rate
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   mode: "0" decides, "1" settles, "2" grants part (see below)
-- ARGV[1+2i], ARGV[2+2i] entry i's cost (0 peeks and starts no window; in
--           settle mode a signed change) and limit "p:rate": period in µs,
--           events per window
--
-- Reply: {allowed, granted, then per entry: remaining, retry_us, reset_us}
-- (granted: settling, the most of a positive cost an entry could not count,
-- the window being full; else as tokenbucket.lua says).
-- A denied request can succeed when its window ends: retry_us is the time
-- left until then. Settling adds the cost to the window's count, kept
-- within [0, rate] (a positive one opens a window if none runs); it is
-- never denied.
-- Granting part (AllowAtMost, every entry's cost the same n >= 1): granted
-- is the least of n and what every entry's window still admits, charged
-- to every entry, allowed 1; when some entry admits none, granted is 0,
-- allowed 0, nothing is charged and retry_us is the wait for one event.
-- A window keeps no debt: what Settle takes beyond the rate is forgiven.
--
-- A state written under another limit: if its window has not ended by the
-- old period, its count carries over, capped at rate, in the same window,
-- which now lasts the new period from its start; the call writes it.
--
-- Invariants: c <= rate; a denied call charges nothing; a written key
-- expires when its window ends.
local now = now_us()
local settle = ARGV[2] == '1'
local partial = ARGV[2] == '2'

local n = #KEYS
local start, cnt, p, rate, cost, lim, dirty = {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  cost[i], lim[i] = tonumber(ARGV[1 + 2 * i]), ARGV[2 + 2 * i]
  p[i], rate[i] = window_limit(lim[i])
  local s, c, old = pair_get(KEYS[i])
  if s ~= nil and old ~= lim[i] then
    local op = tonumber(string.match(old, '^(%d+)'))
    if now < s + op and s <= now and c > 0 then
      c, dirty[i] = math.min(c, rate[i]), true
    else
      s = nil
    end
  end
  if s == nil or now >= s + p[i] or s > now then
    s, c, dirty[i] = now, 0, false
  end
  start[i], cnt[i] = s, c
  if not settle and not partial and c + cost[i] > rate[i] then allowed = 0 end
end

-- Granting part: every entry is then decided for the grant (or, when it
-- is none, for one event, which sets retry_us).
local granted = 0
if partial then
  granted = cost[1]
  for i = 1, n do granted = math.min(granted, rate[i] - cnt[i]) end
  granted = math.max(granted, 0)
  if granted < 1 then allowed = 0 end
  for i = 1, n do cost[i] = math.max(granted, 1) end
end

local reply = {allowed, granted}
local uncharged = 0 -- settling: the most of a cost a window could not count
for i = 1, n do
  local c = cnt[i]
  local left = start[i] + p[i] - now
  local retry = 0
  if settle then
    uncharged = math.max(uncharged, c + cost[i] - rate[i])
    c = math.min(math.max(c + cost[i], 0), rate[i])
  elseif allowed == 1 then
    c = c + cost[i]
  elseif c + cost[i] > rate[i] then
    retry = left
  end
  if c ~= cnt[i] or dirty[i] then
    put(KEYS[i], string.format('%d:%d:', start[i], c) .. lim[i], left)
  end
  local reset = 0
  if c > 0 then reset = left end
  reply[#reply + 1] = rate[i] - c
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
if settle then reply[2] = uncharged end
return reply
