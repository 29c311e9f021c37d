-- ledger.lua: the token buckets of tokenbucket.lua, one per limit of a key,
-- each with a ledger of the tokens holders (hybrid instances) have leased
-- and may still spend. A bucket refills only up to its capacity minus what
-- its ledger holds, so that the level plus the tokens held never exceed the
-- capacity: a fleet then admits, over any interval T, at most capacity +
-- rate·T of every limit, as one bucket per limit would, whatever it held
-- when the interval began. A grant takes the same tokens from every bucket
-- and is recorded in every ledger (a token spent counts against every
-- limit). The buckets' state and refill are lib.lua's (bucket_get, fill);
-- the ledger follows the state in the same string.
--
-- Limit i (1..n) has KEYS[i], as KEYS[1] below, and its limit in ARGV[5]
-- (i = 1) or ARGV[9+i] (i >= 2); the optional refund marker is KEYS[n+1].
--
-- KEYS[1]  string "k:r:ts:unit:per:cap" then the ledger: the bucket as
--          tokenbucket.lua's (the level is k tokens and r/unit of one
--          more, ts = µs of the last write, unit:per:cap the limit it was
--          written under), then, if any holder has a record,
--          "|total:lo:hi" and a record ";holder:held:gen:deadline:grant"
--          per holder: tokens the holder may still spend (an upper bound),
--          the number of its last claim, the µs after which it spends none
--          of them (it promises to stop before), and what its last claim
--          handed out (granted and recovered). total is the sum of the
--          records' held, lo a µs at most every record's deadline, hi one
--          at least every deadline: until lo passes, a call reads only its
--          holder's record. One key, read and written once: the ledger
--          costs Redis no command of its own. An absent key is a full
--          bucket with an empty ledger.
-- KEYS[2]  optional: the marker of an idempotent refund (once in lib.lua).
-- ARGV[1]  client clock in µs, or 0 for TIME
-- ARGV[2]  min: tokens required; fewer available denies and grants nothing
--          ('batch' instead: many claims in one call, see the end of the file)
-- ARGV[3]  want: tokens to take at most (>= min)
-- ARGV[4]  refund: tokens the holder gives back (it holds none after)
-- ARGV[5]  the limit "unit:per:cap": unit (units per token), per (units
--          refilled per µs), cap (capacity in tokens)
-- ARGV[6]  hold: µs from a grant to the holder's deadline
-- ARGV[7]  gen: the claim's number (claims of a holder are numbered in
--          order; a claim with its holder's record's number is the same
--          claim sent again, and is handed what it handed out then), or
--          for a refund the number of the last claim before it
-- ARGV[8]  held: for a claim, the tokens the holder still holds as it sends
--          it (an upper bound); -1 for a call that is not a holder's claim
-- ARGV[9]  holder, or '' for a call that holds nothing (AllowN); never
--          ':' or ';' (the store checks)
-- ARGV[10] orphan, the number of the holder's first claim whose reply it
--          never got, none of the later ones' either (0: none); Redis may
--          have run them (a refund may give back nothing but an orphan's
--          grant)
-- ARGV[11..] the limits of limits 2..n, as ARGV[5]
--
-- Reply: as tokenbucket.lua, {allowed, granted, then per limit: remaining,
-- retry_us, reset_us}; remaining is the level, what a claim could take
-- now. A claim
-- that names an orphan its record shows was run (the record's number is the
-- orphan's or later, in every limit's ledger) is granted again what the
-- record's claim handed out (its grant and what it recovered in turn),
-- without taking it again: granted counts it, and min counts it first.
--
-- A state written under another limit is refilled under it up to now, to
-- at most its capacity less every token the ledger holds, and converted
-- (bucket_convert in lib.lua): its tokens kept, capped at the new capacity.
--
-- A clock behind ts: the call is decided at ts, as tokenbucket.lua
-- decides, deadlines included; waits and TTLs count from the clock the call
-- read.
--
-- Invariants, per limit, with O the tokens its ledger holds: k + O <= cap
-- after every call, r < unit, and r = 0 when k + O = cap; the level rises by at most
-- per units a µs of elapsed time, whatever the ledger does (a holder's
-- deadline passing raises the ceiling, not the level); a denied call grants nothing; every key has a TTL, and the state
-- lives until the bucket is full after the ledger's last deadline.

-- A record of the ledger: its whole text, holder, held, gen, deadline and
-- grant.
local record = '(;([^:;]+):(%d+):(%d+):(%d+):(%d+))'

-- claim runs one call as ARGV[2..10] describe it, on the n buckets keys
-- (their limits in lims), at clock, and returns its reply.
local function claim(clock, keys, lims, min, want, refund, hold, gen, held, holder, orphan)
  local n = #keys

  -- Per limit i: B[i], its bucket refilled up to its clock and its ledger
  -- read, records past their deadline dropped (each table built whole: Lua
  -- resizes a table that grows).
  local B = {}
  for i = 1, n do
    local lim = lims[i]
    local unit, per, cap = tb_limit(lim)
    local b = {bk = keys[i], lim = lim, unit = unit, per = per, cap = cap,
      k = 0, r = 0, now = 0, total = 0, lo = 0, hi = 0, dirty = false, mine = false, rec = false, before = '', after = '', keep = 0}
    local k, r, ts, old, rest = bucket_get(b.bk)
    local now = clock
    if ts and ts > now then now = ts end
    b.now = now

    -- The ledger. Until a deadline passes (lo), only the holder's record is
    -- read, and the others are kept as they are spelled; then every record
    -- is, those past their deadline are dropped (dead, in time order), and
    -- lo and hi are the live records' earliest and latest deadlines.
    local total, lo, hi, recs = 0, 0, 0, ''
    if rest and rest ~= '' then
      local t, l, h, rs = string.match(rest, '^|(%d+):(%d+):(%d+)(.*)$')
      if t then total, lo, hi, recs = tonumber(t), tonumber(l), tonumber(h), rs end
    end
    local dead
    if recs ~= '' and lo <= now then
      total, lo, hi = 0, 0, 0
      local live = {}
      for rec, h, a, g, d, last in string.gmatch(recs, record) do
        a, d = tonumber(a), tonumber(d)
        total = total + a
        if d <= now then
          if dead then dead[#dead + 1] = {d, a} else dead = {{d, a}} end
        else
          if d > hi then hi = d end
          if lo == 0 or d < lo then lo = d end
          if h == holder then
            b.mine, b.rec = {a, tonumber(g), d, tonumber(last)}, rec
          else
            live[#live + 1] = rec
          end
        end
      end
      b.before = table.concat(live)
    elseif recs ~= '' then
      b.before = recs
      local i = holder ~= '' and string.find(recs, ';' .. holder .. ':', 1, true)
      local rec, _, a, g, d, last
      if i then rec, _, a, g, d, last = string.match(recs, '^' .. record, i) end
      if rec then
        b.mine, b.rec = {tonumber(a), tonumber(g), tonumber(d), tonumber(last)}, rec
        b.before, b.after = string.sub(recs, 1, i - 1), string.sub(recs, i + #rec)
      end
    end

    -- Refill up to now, the ceiling rising at each deadline passed.
    if k and old ~= lim then
      k, r, ts = bucket_convert(k, r, ts, old, now, b.unit, b.cap, total)
      b.dirty = true
    end
    if not k then
      k, r, ts = math.max(b.cap - total, 0), 0, now
    elseif k >= b.cap - total then
      k, r = math.max(b.cap - total, 0), 0
    end
    if dead then
      if #dead > 1 then table.sort(dead, function(x, y) return x[1] < y[1] end) end
      for _, x in ipairs(dead) do
        if x[1] > ts then
          k, r = fill(k, r, x[1] - ts, b.unit, b.per, b.cap - total)
          ts = x[1]
        end
        total = total - x[2]
      end
      b.dirty = true
    end
    b.k, b.r = fill(k, r, now - ts, b.unit, b.per, b.cap - total)
    b.total, b.lo, b.hi = total, lo, hi
    B[i] = b
  end

  -- A claim numbered as the holder's records are is that claim sent again
  -- (go-redis resends a command whose connection broke): it ran, and its
  -- reply was lost. It hands over again what it handed out then, and takes,
  -- records and recovers nothing.
  local asked = min
  local again = holder ~= '' and held >= 0 and refund == 0
  if again then
    for i = 1, n do
      local m = B[i].mine
      if not m or m[2] ~= gen then
        again = false
        break
      end
    end
  end
  if again then orphan, want, min, held = 0, 0, 0, -1 end

  -- A claim whose reply the holder never got, and that ran: what it granted
  -- is in the holder's records (one per limit, written together), not in the
  -- holder's hands. Hand it over; a refund gives it back with the rest.
  local recovered = 0
  if orphan > 0 and holder ~= '' then
    recovered = -1
    for i = 1, n do
      local m = B[i].mine
      if not m or m[2] < orphan then
        recovered = 0
        break
      end
      -- A refund covers the claims numbered up to its own: a later claim's
      -- record, and what it handed out, is the later claim's.
      if held < 0 and m[2] > gen then
        recovered = 0
        break
      end
      local x = math.min(m[4], m[1])
      if recovered < 0 or x < recovered then recovered = x end
    end
    if held < 0 then
      refund, recovered = refund + recovered, 0
    else
      held = held + recovered
      min = math.max(min - recovered, 0)
    end
  end

  -- The holder's report, in every ledger: a refund ends its record (unless
  -- a later claim wrote it); a claim lowers it to what the holder says it
  -- still holds.
  local grant = want
  for i = 1, n do
    local b = B[i]
    b.keep = 0 -- what holder's record holds before this call's grant
    if b.mine then b.keep = b.mine[1] end
    if refund > 0 then
      if b.mine and b.mine[2] <= gen then
        b.total, b.keep, b.mine, b.rec = b.total - b.keep, 0, false, false
      end
      if b.k + refund >= b.cap - b.total then
        b.k, b.r = math.max(b.cap - b.total, 0), 0
      else
        b.k = b.k + refund
      end
      b.dirty = true
    elseif b.mine and held >= 0 and held < b.keep then
      b.total, b.keep = b.total - b.keep + held, held
    end
    if b.k < grant then grant = b.k end
  end

  local allowed = 1
  if grant < min then grant, allowed = 0, 0 end
  if again then
    recovered, min = B[1].mine[4], asked
    for i = 2, n do recovered = math.min(recovered, B[i].mine[4]) end
    if recovered < min then allowed = 0 end
  end
  local reply = {allowed, grant + recovered}
  for i = 1, n do
    local b = B[i]
    b.k = b.k - grant
    if holder ~= '' and held >= 0 and (grant > 0 or b.mine) then
      if grant > 0 then
        local d = b.now + hold
        if d > b.hi then b.hi = d end
        if b.lo == 0 or d < b.lo then b.lo = d end
        b.rec = string.format(';%s:%d:%d:%d:%d', holder, b.keep + grant, gen, d, grant + recovered)
      elseif b.keep > 0 then
        b.rec = string.format(';%s:%d:%d:%d:%d', holder, b.keep, gen, b.mine[3], recovered)
      else
        b.rec = false
      end
      b.total = b.total + grant
      b.dirty = true
    end
    if grant > 0 then b.dirty = true end

    local lag = b.now - clock
    local reset = lag + wait_us(b.k, b.r, b.cap, b.unit, b.per)
    if b.dirty then
      -- The level only rises until a grant rewrites the state: full by the
      -- last deadline plus reset, when the absent key means a full bucket
      -- with an empty ledger. The value is built in one concatenation: a
      -- ledger of many holders is long, and each string costs its length.
      local rec = b.rec or ''
      if b.before == '' and rec == '' and b.after == '' then
        bucket_put(b.bk, b.k, b.r, b.now, b.cap, reset, b.lim)
      else
        put(b.bk, string.format('%d:%d:%d:%s|%d:%d:%d', b.k, b.r, b.now, b.lim, b.total, b.lo, b.hi) ..
          b.before .. rec .. b.after, math.max(b.hi - b.now, 0) + reset)
      end
    end
    local retry = 0
    if allowed == 0 then retry = lag + wait_us(b.k, b.r, min, b.unit, b.per) end
    reply[#reply + 1] = b.k
    reply[#reply + 1] = retry
    reply[#reply + 1] = reset
  end
  return reply
end

-- A batch: ARGV[2] is 'batch', ARGV[3] hold, then per claim c: its
-- number of limits n, min, want, gen, held, holder, orphan and its n
-- limits; its n keys follow the claims' before it in KEYS. The claims
-- (never refunds) run in order at one clock; the reply lists theirs.
if ARGV[2] == 'batch' then
  local clock, hold = now_us(), tonumber(ARGV[3])
  local out, j, kj = {}, 4, 0
  while j <= #ARGV do
    local n = tonumber(ARGV[j])
    local keys, lims = {}, {}
    for i = 1, n do
      keys[i], lims[i] = KEYS[kj + i], ARGV[j + 6 + i]
    end
    out[#out + 1] = claim(clock, keys, lims, tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), 0, hold,
      tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5], tonumber(ARGV[j + 6]))
    j, kj = j + 7 + n, kj + n
  end
  return out
end

local n = 1
if #ARGV > 10 then n = #ARGV - 9 end
local keys, lims = {}, {ARGV[5]}
for i = 1, n do keys[i] = KEYS[i] end
for i = 2, n do lims[i] = ARGV[9 + i] end
local refund = tonumber(ARGV[4])
if refund > 0 and not once(KEYS[n + 1]) then
  refund = 0 -- this refund ran already
end
return claim(now_us(), keys, lims, tonumber(ARGV[2]), tonumber(ARGV[3]), refund, tonumber(ARGV[6]),
  tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10]))
