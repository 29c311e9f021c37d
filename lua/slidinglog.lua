-- slidinglog.lua: sliding log over one or more limits, all-or-nothing. Every
-- admitted request is an entry of a sorted set scored by its time; a request
-- is allowed when the entries of the last period plus its cost fit the rate.
--
-- KEYS[2i-1] sorted set of limit i: member "seq:cost", score = µs admitted
-- KEYS[2i]   string "sum:seq:last" of limit i: sum = total cost in the set,
--            seq = last member id, last = µs of the newest entry
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
local sum, seq, last, p, rate = {}, {}, {}, {}, {}
local allowed = 1

-- save writes limit i's state; both keys live until its newest entry leaves
-- the window.
local function save(i)
  local ttl = last[i] + p[i] - now
  put(KEYS[2 * i], str(sum[i]) .. ':' .. str(seq[i]) .. ':' .. str(last[i]), ttl)
  expire_us(KEYS[2 * i - 1], ttl)
end

for i = 1, n do
  local a = 2 + (i - 1) * 2
  p[i], rate[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local zs, hs = KEYS[2 * i - 1], KEYS[2 * i]
  local st = fields(redis.call('GET', hs)) or {}
  sum[i], seq[i], last[i] = st[1] or 0, st[2] or 0, st[3] or 0
  if sum[i] > 0 and last[i] + p[i] <= now then
    -- Every entry has left the window.
    redis.call('DEL', zs, hs)
    sum[i], seq[i] = 0, 0
  elseif sum[i] > 0 then
    local old = redis.call('ZRANGEBYSCORE', zs, '-inf', str(now - p[i]))
    if #old > 0 then
      for _, m in ipairs(old) do
        sum[i] = sum[i] - tonumber(string.match(m, ':(%d+)$'))
      end
      redis.call('ZREMRANGEBYSCORE', zs, '-inf', str(now - p[i]))
      save(i)
    end
  end
  if sum[i] + cost > rate[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local zs = KEYS[2 * i - 1]
  local retry = 0
  if allowed == 1 and cost > 0 then
    seq[i] = seq[i] + 1
    redis.call('ZADD', zs, str(now), str(seq[i]) .. ':' .. str(cost))
    sum[i], last[i] = sum[i] + cost, now
    save(i)
  elseif allowed == 0 and sum[i] + cost > rate[i] then
    -- Walk the oldest entries, in growing batches, until enough cost has
    -- left the window (usually the first entry does).
    local need = sum[i] + cost - rate[i]
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
  if sum[i] > 0 then reset = last[i] + p[i] - now end
  reply[#reply + 1] = rate[i] - sum[i]
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
