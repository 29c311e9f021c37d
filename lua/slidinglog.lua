-- slidinglog.lua: sliding log, one per entry (a user key under one of its
-- limits), decided all-or-nothing, partly granted, or settled. Every
-- admitted request is an entry of a sorted set scored by its time; a
-- request is allowed when the entries of the last period plus its cost fit
-- the rate.
--
-- KEYS[2i-1] entry i's sorted set: member "seq:cost", score = µs admitted
-- KEYS[2i]   entry i's string "sum:seq:last:first:fcost:zexp:unit": sum =
--            total cost in the set, seq = last member id, last = µs of the
--            newest entry, first and fcost = µs and cost of the oldest entry
--            (the set's first by rank; 0:0 when the set is empty or the
--            oldest is not known), zexp = µs when the sorted set expires,
--            unit = 1 when every entry costs 1.
--            Knowing the oldest entry, a call whose window has dropped
--            nothing, and a denial that the oldest entry's leaving settles,
--            touch no sorted set. When every entry costs 1, expired entries
--            are dropped by score and counted (one command; the oldest left
--            is then not known); otherwise they are read from the front to
--            subtract their costs, and the oldest left is learnt. The sorted
--            set's TTL runs to two periods past its newest entry and is
--            extended only when less than one is left: most calls make no
--            PEXPIRE.
-- ARGV[1]    client clock in µs, or 0 for TIME
-- ARGV[2]    mode: "0" decides, "1" settles, "2" grants part (see below)
-- ARGV[1+2i], ARGV[2+2i] entry i's cost (0 peeks; in settle mode a signed
--            change) and limit "p:rate": period in µs, events per period
--
-- Reply: {allowed, granted, then per entry: remaining, retry_us, reset_us}
-- (granted: settling, the most of a positive cost an entry could not count,
-- the window being full; else as tokenbucket.lua says).
-- retry_us is when enough of the oldest entries leave the window for the
-- request to fit: exact. Settling adds a positive cost as an entry, up to
-- what fits the rate; a negative one comes off the newest entries (whole
-- ones removed, the last one's cost lowered); it is never denied.
-- Granting part (AllowAtMost, every entry's cost the same n >= 1): granted
-- is the least of n and what every entry's window still admits, charged
-- to every entry, allowed 1; when some entry admits none, granted is 0,
-- allowed 0, nothing is charged and retry_us is the wait for one event.
-- A window keeps no debt: what Settle takes beyond the rate is forgiven.
--
-- The log does not record its limit: its entries mean the same under any,
-- so a changed limit judges the same log by the new period and rate (a
-- lower rate may find sum above it: denied until enough entries leave).
-- Memory is one entry per admitted request: O(rate) per key.
-- Invariants: sum = Σ cost of the set's entries, <= rate unless the rate
-- was lowered (a cost of 0 peeks, allowed whatever sum); first:fcost is the
-- set's first entry or unknown (0:0); a denied call only drops expired
-- entries; last + period <= zexp, and both keys live until zexp, the
-- state string a few ms longer (a state without its set would count
-- entries that are gone; a set without its state is read as all expired
-- entries, which the first branch below deletes).
local now = now_us()
local settle = ARGV[2] == '1'
local partial = ARGV[2] == '2'

-- stateMargin (µs) keeps the state string past its sorted set: the two
-- TTLs are rounded up to whole ms from different calls' clocks.
local stateMargin = 3000

-- parse returns the fields of a state string v (nil: an empty log):
-- sum, seq, last, first (nil when not known), fcost, zexp, unit.
local function parse(v)
  if not v then return 0, 0, 0, 0, 0, 0, 1 end
  local a1, a2, a3, a4, a5, a6, a7 = string.match(v, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  local s, f = tonumber(a1), tonumber(a4)
  if f == 0 and s > 0 then f = nil end
  return s, tonumber(a2), tonumber(a3), f, tonumber(a5), tonumber(a6), tonumber(a7)
end

-- scan drops the entries of zs that left a window of p, reading them from
-- the front in growing batches to subtract their costs from s. It returns
-- the new sum and the oldest entry left (0, 0 if none).
local function scan(zs, s, p)
  local cutoff, dropped, from, size, f, fc = now - p, 0, 0, 2, 0, 0
  while true do
    local e = redis.call('ZRANGE', zs, from, from + size - 1, 'WITHSCORES')
    local found = false
    for j = 1, #e, 2 do
      local c, t = tonumber(string.match(e[j], ':(%d+)$')), tonumber(e[j + 1])
      if t > cutoff then
        f, fc, found = t, c, true
        break
      end
      s, dropped = s - c, dropped + 1
    end
    if found or #e < 2 * size then break end
    from, size = from + size, size * 4
  end
  if dropped > 0 then
    redis.call('ZREMRANGEBYRANK', zs, 0, dropped - 1)
  end
  return s, f, fc
end

-- drop drops the entries of zs that left a window of p when every entry
-- costs 1: by score, in one command, subtracting their count from s. It
-- returns the new sum, the oldest entry (nil, nil: not known; 0, 0: none)
-- and whether any was dropped.
local function drop(zs, s, f, fc, p)
  local dropped = redis.call('ZREMRANGEBYSCORE', zs, '-inf', string.format('%d', now - p))
  if dropped == 0 then return s, f, fc, false end
  s = s - dropped
  if s == 0 then return 0, 0, 0, true end
  return s, nil, nil, true
end

-- add adds an entry of cost to zs, the log of a state s, q, l, f, fc, u,
-- and returns the state after it: s, q, last, f, fc, u. A clock behind
-- the log's entries (client clocks disagree) keeps last the newest and
-- first the oldest, or unknown.
local function add(zs, cost, s, q, l, f, fc, u)
  q = q + 1
  redis.call('ZADD', zs, string.format('%d', now), string.format('%d:%d', q, cost))
  if s == 0 then
    f, fc, u = now, cost, 1
  elseif f and now < f then
    f, fc = nil, nil -- a clock behind the oldest entry: this one is older
  end
  if cost ~= 1 then u = 0 end
  return s + cost, q, math.max(l, now), f, fc, u
end

-- takeback removes back (<= s) of cost from the newest entries of zs, the
-- log of a state s, f, fc, u: whole entries, and the cost of the last one
-- lowered. It returns the state after it: s, f, fc, u. The state's last
-- stays: the newest entry left is no later, so the TTLs still outlast it.
local function takeback(zs, back, s, f, fc, u)
  s = s - back
  while back > 0 do
    local e = redis.call('ZRANGE', zs, -1, -1, 'WITHSCORES')
    if #e == 0 then break end
    local id, c = string.match(e[1], '^(%d+):(%d+)$')
    c = tonumber(c)
    redis.call('ZREM', zs, e[1])
    if c > back then
      c = c - back
      redis.call('ZADD', zs, e[2], string.format('%s:%d', id, c))
      if c ~= 1 then u = 0 end
      f, fc = nil, nil -- it may be the oldest: not known any more
      back = 0
    else
      back = back - c
    end
  end
  if s <= 0 then return 0, 0, 0, 1 end
  return s, f, fc, u
end

-- store writes the state of the log zs to hs, first extending zs's TTL to
-- two periods past its newest entry if less than one is left.
local function store(zs, hs, p, s, q, l, f, fc, z, u)
  if z < l + p then
    z = l + 2 * p
    expire_us(zs, z - now)
  end
  if s == 0 then u = 1 end
  put(hs, string.format('%d:%d:%d:%d:%d:%d:%d', s, q, l, f or 0, fc or 0, z, u), z - now + stateMargin)
end

-- wait returns the time until enough of zs's oldest entries leave a window
-- of p for need more cost to fit, walking them in growing batches.
local function wait(zs, need, p)
  local from, size = 0, 4
  while need > 0 do
    local entries = redis.call('ZRANGE', zs, from, from + size - 1, 'WITHSCORES')
    if #entries == 0 then break end
    for j = 1, #entries, 2 do
      need = need - tonumber(string.match(entries[j], ':(%d+)$'))
      if need <= 0 then return tonumber(entries[j + 1]) + p - now end
    end
    from, size = from + size, size * 4
  end
  return 0
end

local n = #KEYS / 2
local sum, seq, last, first, fcost, zexp, unit, p, rate, cost = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local dirty = {} -- entry i's state must be saved
local allowed = 1

for i = 1, n do
  cost[i] = tonumber(ARGV[1 + 2 * i])
  p[i], rate[i] = window_limit(ARGV[2 + 2 * i])
  local zs, hs = KEYS[2 * i - 1], KEYS[2 * i]
  local s, q, l, f, fc, z, u = parse(redis.call('GET', hs))
  sum[i], seq[i], last[i], first[i], fcost[i], zexp[i], unit[i] = s, q, l, f, fc, z, u
  if s > 0 and l + p[i] <= now then
    -- Every entry has left the window.
    redis.call('DEL', zs, hs)
    sum[i], seq[i], first[i], fcost[i], zexp[i], unit[i] = 0, 0, 0, 0, 0, 1
  elseif s > 0 and u == 1 and (f == nil or f + p[i] <= now) then
    -- Every entry costs 1: drop the expired ones by score.
    sum[i], first[i], fcost[i], dirty[i] = drop(zs, s, f, fc, p[i])
  elseif s > 0 and (f == nil or f + p[i] <= now) then
    -- The oldest entries have left the window (or the oldest is unknown).
    sum[i], first[i], fcost[i] = scan(zs, s, p[i])
    dirty[i] = true
  elseif s == 0 then
    first[i], fcost[i], unit[i] = 0, 0, 1
  end
  if not settle and not partial and cost[i] > 0 and sum[i] + cost[i] > rate[i] then allowed = 0 end
end

-- Granting part: every entry is then decided for the grant (or, when it
-- is none, for one event, which sets retry_us).
local granted = 0
if partial then
  granted = cost[1]
  for i = 1, n do granted = math.min(granted, rate[i] - sum[i]) end
  granted = math.max(granted, 0)
  if granted < 1 then allowed = 0 end
  for i = 1, n do cost[i] = math.max(granted, 1) end
end

local reply = {allowed, granted}
local uncharged = 0 -- settling: the most of a cost a log could not count
for i = 1, n do
  local zs = KEYS[2 * i - 1]
  local retry = 0
  local add_cost = 0
  if settle and cost[i] > 0 then
    add_cost = math.max(0, math.min(cost[i], rate[i] - sum[i]))
    uncharged = math.max(uncharged, cost[i] - add_cost)
  elseif settle and cost[i] < 0 and sum[i] > 0 then
    sum[i], first[i], fcost[i], unit[i] = takeback(zs, math.min(-cost[i], sum[i]), sum[i], first[i], fcost[i], unit[i])
    dirty[i] = true
  elseif not settle and allowed == 1 then
    add_cost = cost[i]
  end
  if add_cost > 0 then
    sum[i], seq[i], last[i], first[i], fcost[i], unit[i] = add(zs, add_cost, sum[i], seq[i], last[i], first[i], fcost[i], unit[i])
    dirty[i] = true
  end
  if dirty[i] then
    store(zs, KEYS[2 * i], p[i], sum[i], seq[i], last[i], first[i], fcost[i], zexp[i], unit[i])
  end
  if allowed == 0 and cost[i] > 0 and sum[i] + cost[i] > rate[i] then
    local need = sum[i] + cost[i] - rate[i]
    if first[i] and fcost[i] >= need then
      retry = first[i] + p[i] - now -- usually the oldest entry's leaving makes room
    else
      retry = wait(zs, need, p[i])
    end
  end
  local reset = 0
  if sum[i] > 0 then reset = last[i] + p[i] - now end
  reply[#reply + 1] = rate[i] - sum[i]
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
if settle then reply[2] = uncharged end
return reply
