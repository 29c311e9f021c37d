-- fixedwindow.lua: fixed windows aligned on the Unix epoch, over one or more
-- limits, all-or-nothing.
--
-- KEYS[i]   string "w:c" of limit i: w = window index (floor(now / period)),
--           c = count
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   n: cost (0 peeks)
-- ARGV[2+2(i-1)+1..2] for limit i: period in µs, rate (events per window)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- A denied request can succeed when its window ends: retry_us is that wait.
-- Invariants: c <= rate; a denied call writes nothing; a written key expires
-- when its window ends.
local now = now_us()
local cost = tonumber(ARGV[2])

local n = #KEYS
local cnt, p, rate, wend = {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 2
  p[i], rate[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local w = idiv(now, p[i])
  wend[i] = (w + 1) * p[i] - now
  local c = 0
  local sw, sc = pair_get(KEYS[i])
  if sw == w and sc then c = sc end
  cnt[i] = c
  if c + cost > rate[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local c = cnt[i]
  local retry = 0
  if allowed == 1 and cost > 0 then
    c = c + cost
    put(KEYS[i], string.format('%d:%d', idiv(now, p[i]), c), wend[i])
  elseif allowed == 0 and c + cost > rate[i] then
    retry = wend[i]
  end
  local reset = 0
  if c > 0 then reset = wend[i] end
  reply[#reply + 1] = rate[i] - c
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
