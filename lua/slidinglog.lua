-- slidinglog.lua: sliding log over one or more limits, all-or-nothing. Every
-- admitted request is an entry of a sorted set scored by its time; a request
-- is allowed when the entries of the last period plus its cost fit the rate.
--
-- KEYS[2i-1] sorted set of limit i: member "seq:cost", score = µs admitted
-- KEYS[2i]   hash of limit i: sum = total cost in the set, seq = next member id
-- ARGV[1]    client clock in µs, or 0 for TIME
-- ARGV[2]    n: cost (0 peeks)
-- ARGV[2+2(i-1)+1..2] for limit i: period in µs, rate (events per period)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
-- retry_us is when enough of the oldest entries leave the window for the
-- request to fit: exact.
-- Memory is one entry per admitted request: O(rate) per key.
-- Invariants: sum = Σ cost of the set's entries <= rate; a denied call only
-- drops expired entries; both keys expire when the newest entry leaves the window.
local now = now_us()
local cost = tonumber(ARGV[2])
local n = #KEYS / 2
local sum, p, rate = {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 2
  p[i], rate[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local zs, hs = KEYS[2 * i - 1], KEYS[2 * i]
  local s = tonumber(redis.call('HGET', hs, 'sum')) or 0
  local old = redis.call('ZRANGEBYSCORE', zs, '-inf', str(now - p[i]))
  if #old > 0 then
    for _, m in ipairs(old) do
      s = s - tonumber(string.match(m, ':(%d+)$'))
    end
    redis.call('ZREMRANGEBYSCORE', zs, '-inf', str(now - p[i]))
    if s <= 0 then
      s = 0
      redis.call('DEL', zs, hs)
    else
      redis.call('HSET', hs, 'sum', str(s))
    end
  end
  sum[i] = s
  if s + cost > rate[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local zs, hs = KEYS[2 * i - 1], KEYS[2 * i]
  local s = sum[i]
  local retry = 0
  if allowed == 1 and cost > 0 then
    local seq = redis.call('HINCRBY', hs, 'seq', 1)
    redis.call('ZADD', zs, str(now), str(seq) .. ':' .. str(cost))
    s = s + cost
    redis.call('HSET', hs, 'sum', str(s))
  elseif allowed == 0 and s + cost > rate[i] then
    -- Walk the oldest entries, in growing batches, until enough cost has
    -- left the window (usually the first entry does).
    local need = s + cost - rate[i]
    local from, size = 0, 1
    while need > 0 do
      local entries = redis.call('ZRANGE', zs, from, from + size - 1, 'WITHSCORES')
      if #entries == 0 then break end
      for j = 1, #entries, 2 do
        need = need - tonumber(string.match(entries[j], ':(%d+)$'))
        if need <= 0 then
          retry = tonumber(entries[j + 1]) + p[i] - now
          break
        end
      end
      from, size = from + size, size * 4
    end
  end
  local reset = 0
  if s > 0 then
    local newest = redis.call('ZRANGE', zs, -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + p[i] - now
    expire_us(zs, reset)
    expire_us(hs, reset)
  end
  reply[#reply + 1] = rate[i] - s
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
