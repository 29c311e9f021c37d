-- heartbeat.lua: the live instances of a hybrid fleet.
--
-- KEYS[1]  the fleet's sorted set: member = instance id, score = the
--          server time (ms) it last beat.
-- ARGV[1]  client clock in µs, or 0 for the server's (see lib.lua)
-- ARGV[2]  this instance's id
-- ARGV[3]  ttl_ms: an instance that has not beaten for this long is gone
-- ARGV[4]  "1": this instance leaves (Close); "0": it beats
--
-- Reply: {the number of live instances, this one included unless it
-- left; 1 if this beat added the instance (its first beat, or it had not
-- beaten for ttl_ms, or Redis lost the key: a restart from empty, a
-- failover, an eviction), else 0}.
--
-- Invariants: members older than ttl_ms are removed on every call; the key
-- expires ttl_ms after the last beat, so an abandoned fleet leaves nothing.

local now_ms = idiv(now_us(), 1000)
local ttl = tonumber(ARGV[3])
local added = 0
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[2])
else
  added = redis.call('ZADD', KEYS[1], now_ms, ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - ttl)
local n = redis.call('ZCARD', KEYS[1])
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {n, added}
