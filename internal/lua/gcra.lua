-- gcra.lua: generic cell rate algorithm over one or more limits,
-- all-or-nothing. One integer per limit: the theoretical arrival time (TAT).
--
-- KEYS[i]   string: TAT of limit i in µs. Absent means TAT <= now (full).
-- ARGV[1]   client clock in µs, or 0 for TIME
-- ARGV[2]   n: cost (0 peeks)
-- ARGV[2+2(i-1)+1..2] for limit i: t (emission interval in µs, rounded up:
--           GCRA never admits faster than the limit), tau (capacity × t)
--
-- Reply: {allowed, granted, then per limit: remaining, retry_us, reset_us}.
--
-- A request of cost n is allowed by limit i when max(TAT, now) + n·t - now <= tau.
-- Invariants: a denied call writes nothing; a written TAT expires when it
-- passes (an expired key reads as TAT <= now, the same state).
local now = now_us()
local cost = tonumber(ARGV[2])

local n = #KEYS
local tat, t, tau = {}, {}, {}
local allowed = 1
for i = 1, n do
  local a = 2 + (i - 1) * 2
  t[i], tau[i] = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local v = tonumber(redis.call('GET', KEYS[i]))
  if v == nil or v < now then v = now end
  tat[i] = v
  if v + cost * t[i] - now > tau[i] then allowed = 0 end
end

local reply = {allowed, allowed * cost}
for i = 1, n do
  local v = tat[i]
  local retry = 0
  if allowed == 1 then
    v = v + cost * t[i]
    if cost > 0 then
      put(KEYS[i], str(v), v - now)
    end
  elseif v + cost * t[i] - now > tau[i] then
    retry = v + cost * t[i] - now - tau[i]
  end
  reply[#reply + 1] = idiv(now + tau[i] - v, t[i])
  reply[#reply + 1] = retry
  reply[#reply + 1] = v - now
end
return reply
