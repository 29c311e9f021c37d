-- slidingwindow.lua: sliding window counter over one or more limits,
-- all-or-nothing. The count of the previous fixed window, weighted by how
-- much of it the sliding window still covers, plus the current window's
-- count must fit the rate.
--
-- KEYS[i]   string "w:c:pc" of limit i: w = current window index, c = its
--           count, pc = the previous window's count
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   n: cost (0 peeks)
-- ARGV[2+3(i-1)+1..3] for limit i: period in µs, rate, q: the weight's
--           grain in µs, chosen so that rate × (period / q) stays below 2^51
--
-- The previous window weighs ceil(pc × k / m), where m = floor(period / q)
-- and k = ceil((period - elapsed) / q): never less than the exact weight, so
-- the grain can only under-admit.
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- retry_us is exact for this arithmetic: the first µs at which the request fits.
-- Invariants: c <= rate; a denied call writes nothing; keys expire when both
-- windows they hold have passed.
local now = now_us()
local cost = tonumber(ARGV[2])

local n = #KEYS
local cur, prev, w, p, rate, q, est = {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 3
  p[i], rate[i], q[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  w[i] = idiv(now, p[i])
  local sw, c, pc = nil, 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local vw, vc, vp = string.match(v, '^(%d+):(%d+):(%d+)$')
    sw, c, pc = tonumber(vw), tonumber(vc), tonumber(vp)
  end
  if sw == w[i] - 1 then
    pc = c -- the window rolled over: this window's count becomes the previous one
    c = 0
  elseif sw ~= w[i] then
    c = 0
    pc = 0
  end
  cur[i], prev[i] = c, pc
  local m = idiv(p[i], q[i])
  local k = cdiv(p[i] - (now - w[i] * p[i]), q[i])
  est[i] = math.min(pc, cdiv(pc * k, m)) + c
  if est[i] + cost > rate[i] then allowed = 0 end
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

local reply = {allowed, allowed * cost}
for i = 1, n do
  local c = cur[i]
  local retry = 0
  if allowed == 1 and cost > 0 then
    c = c + cost
    est[i] = est[i] + cost
    put(KEYS[i], string.format('%d:%d:%d', w[i], c, prev[i]), (w[i] + 2) * p[i] - now)
  elseif allowed == 0 and est[i] + cost > rate[i] then
    retry = fits(i, prev[i], rate[i] - cost - c, w[i] * p[i])
    if retry == nil then
      retry = fits(i, c, rate[i] - cost, (w[i] + 1) * p[i]) or ((w[i] + 2) * p[i] - now)
    end
  end
  local reset = 0
  if c > 0 then
    reset = (w[i] + 2) * p[i] - now
  elseif prev[i] > 0 then
    reset = (w[i] + 1) * p[i] - now
  end
  reply[#reply + 1] = rate[i] - est[i]
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
