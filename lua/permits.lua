-- permits.lua: the permits of one key of a concurrency limiter.
--
-- KEYS[1]  sorted set: member = holder id, score = the server time (ms)
--          at which the holder's permits expire unless renewed
-- KEYS[2]  hash: holder id -> permits it holds; field "=" -> their total
--          (holder ids are the library's, never "=")
-- ARGV[1]  client clock in µs, or 0 for the server's (see lib.lua)
-- ARGV[2]  "s": set one holder's permits; "r": renew holders; "R": renew
--          holders, recording again those the key lost
--
-- "s": ARGV[3] holder, ARGV[4] target count, ARGV[5] n (the key's limit),
--      ARGV[6] ttl_ms, ARGV[7] "1" to record the target whatever the total
--      (permits already in flight, given out while Redis was away), else
--      "0". A holder moves to its target if that gives back permits; a rise
--      is granted up to what the total leaves free under n, so a partial
--      grant is possible. A holder left with 0 is removed. A holder with
--      permits expires ttl_ms from now. Reply: {count it now holds, total}.
--      The call sets an absolute count, so running it twice (go-redis
--      resends a command whose connection broke) does what once does.
-- "r": ARGV[3] ttl_ms, ARGV[4..] holders: each holder still present expires
--      ttl_ms from now. Reply: the count each holds (0: expired, lost).
-- "R": ARGV[3] ttl_ms, ARGV[4..] pairs of holder and the count it holds:
--      each holder still present expires ttl_ms from now; one the key lost
--      (Redis flushed, restarted empty or evicted the state, or expired the
--      holder while its renewals could not reach Redis) is recorded again
--      with its count, whatever the total: those permits are in flight.
--      Reply: per holder, the count it holds if it was present, else minus
--      the count recorded again (0: nothing to record).
--
-- Invariants: every call first removes expired holders and their permits;
-- the total is the sum of the holders' counts and, but for forced records,
-- never exceeds n; both keys expire with the latest holder, and are
-- deleted when none is left.

local now = idiv(now_us(), 1000)
local zset, hash = KEYS[1], KEYS[2]

local gone = redis.call('ZRANGEBYSCORE', zset, '-inf', now)
if #gone > 0 then
  local freed = 0
  for _, h in ipairs(gone) do
    freed = freed + (tonumber(redis.call('HGET', hash, h)) or 0)
    redis.call('HDEL', hash, h)
  end
  redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  redis.call('HINCRBY', hash, '=', -freed)
end

-- tidy gives both keys the TTL of the latest holder, or deletes them.
local function tidy()
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', zset, hash)
    return
  end
  local ms = tonumber(last[2]) - now + 1
  redis.call('PEXPIRE', zset, ms)
  redis.call('PEXPIRE', hash, ms)
end

if ARGV[2] == 'R' then
  local ttl = tonumber(ARGV[3])
  local total = tonumber(redis.call('HGET', hash, '=')) or 0
  local counts = {}
  for i = 4, #ARGV, 2 do
    local h, want = ARGV[i], tonumber(ARGV[i + 1])
    local c = 0
    if redis.call('ZSCORE', zset, h) then
      redis.call('ZADD', zset, 'XX', now + ttl, h)
      c = tonumber(redis.call('HGET', hash, h)) or 0
    elseif want > 0 then
      total = total + want
      redis.call('HSET', hash, h, want, '=', total)
      redis.call('ZADD', zset, now + ttl, h)
      c = -want
    end
    counts[#counts + 1] = c
  end
  tidy()
  return counts
end

if ARGV[2] == 'r' then
  local ttl = tonumber(ARGV[3])
  local counts = {}
  for i = 4, #ARGV do
    local h = ARGV[i]
    local c = 0
    if redis.call('ZSCORE', zset, h) then
      redis.call('ZADD', zset, 'XX', now + ttl, h)
      c = tonumber(redis.call('HGET', hash, h)) or 0
    end
    counts[#counts + 1] = c
  end
  tidy()
  return counts
end

local holder, target = ARGV[3], tonumber(ARGV[4])
local n, ttl, force = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local cur = tonumber(redis.call('HGET', hash, holder)) or 0
local total = tonumber(redis.call('HGET', hash, '=')) or 0
local want = target - cur
if want > 0 and not force then
  want = math.max(math.min(want, n - total), 0)
end
local count = cur + want
total = total + want
if count > 0 then
  redis.call('HSET', hash, holder, count, '=', total)
  redis.call('ZADD', zset, now + ttl, holder)
else
  redis.call('HDEL', hash, holder)
  redis.call('ZREM', zset, holder)
  redis.call('HSET', hash, '=', total)
end
tidy()
return {count, total}
