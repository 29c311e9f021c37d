-- mark.lua: a short-lived mark that a hybrid charge-back found a key's
-- bucket full after an outage (docs/design.md, G4, "Charged back"): the
-- other instances' charges of the same outage then forgive what the bucket
-- cannot pay, as refill it dropped at its cap.
--
-- KEYS[1]  the mark, in the bucket's hash slot
-- ARGV[1]  client clock in µs, or 0 (unused: the mark's age is its TTL)
-- ARGV[2]  ttl_ms > 0: set the mark for that long; 0: only read it
--
-- Reply: 1 if the mark exists after the call, else 0.
--
-- Invariants: the mark always has a TTL; reading it writes nothing.
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], '1', 'PX', ttl)
  return 1
end
return redis.call('EXISTS', KEYS[1])
