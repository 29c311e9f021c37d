-- anchoredwindow.lua: fixed windows that start at a key's first admitted hit
-- and last one period, over one or more limits, all-or-nothing.
--
-- KEYS[i]   string "s:c" of limit i: s = µs the window started, c = count
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   n: cost (0 peeks and starts no window)
-- ARGV[2+2(i-1)+1..2] for limit i: period in µs, rate (events per window)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- A denied request can succeed when its window ends: retry_us is the time
-- left until then.
-- Invariants: c <= rate; a denied call writes nothing; a written key expires
-- when its window ends.
local now = now_us()
local cost = tonumber(ARGV[2])

local n = #KEYS
local start, cnt, p, rate = {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 2
  p[i], rate[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local s, c = pair_get(KEYS[i])
  if s == nil or c == nil or now >= s + p[i] or s > now then
    s, c = now, 0
  end
  start[i], cnt[i] = s, c
  if c + cost > rate[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local c = cnt[i]
  local left = start[i] + p[i] - now
  local retry = 0
  if allowed == 1 and cost > 0 then
    c = c + cost
    put(KEYS[i], string.format('%d:%d', start[i], c), left)
  elseif allowed == 0 and c + cost > rate[i] then
    retry = left
  end
  local reset = 0
  if c > 0 then reset = left end
  reply[#reply + 1] = rate[i] - c
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
