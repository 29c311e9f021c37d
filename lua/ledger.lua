-- ledger.lua: the token buckets of tokenbucket.lua, one per limit of a key,
-- each with a ledger of the tokens holders (hybrid instances) have leased
-- and may still spend. A bucket refills only up to its capacity minus what
-- its ledger holds, so that the level plus the tokens held never exceed the
-- capacity: a fleet then admits, over any interval T, at most capacity +
-- rate·T of every limit, as one bucket per limit would. A grant takes the
-- same tokens from every bucket and is recorded in every ledger (a token
-- spent counts against every limit). The buckets' state and refill are
-- lib.lua's (bucket_get, fill); the ledger follows the state in the same
-- string.
--
-- KEYS     per call, its n keys, one per limit; a lone refund's marker
--          follows its keys (once and done in lib.lua): it holds, for
--          30 s after the refund ran, what the refund took back.
-- KEYS[i]  string "k:r:ts:unit:per:cap" then the ledger: the bucket as
--          tokenbucket.lua's (the level is k tokens and r/unit of one
--          more, ts = µs of the last write, unit:per:cap the limit it was
--          written under), then, if any holder has a record,
--          "|total:lo:hi" and a record ";holder:held:gen:deadline:handed"
--          per holder: held, the tokens the holder may still spend plus
--          those handed to it in replies it never got (an upper bound);
--          gen, the number of its last call; deadline, the µs after which
--          it spends none of them; handed, the total ever handed to it in
--          replies, as its calls count what they received (a record that
--          holds nothing stays until its deadline: set_record). total is
--          the sum of the records' held, lo a µs at most every deadline, hi
--          one at least every deadline: until lo passes, a call reads only
--          its holder's record. An absent key is a full bucket with an
--          empty ledger.
-- ARGV[1]  client clock in µs, or 0 for TIME
-- ARGV[2]  hold: µs from a reply that hands tokens to the holder's deadline
-- ARGV[3]  the mode: 'batch' (the calls follow from ARGV[4], all claims or
--          takes, in order, at one clock; the reply is theirs, one after
--          the other, in one flat array: Redis turns each table of a reply
--          into RESP with several lookups, a cost per call), or the
--          op of the one call that follows from ARGV[3]:
--   claim    op n min want gen held received live debt holder lim1..limn
--   refund   op n back give gen received live holder lim1..limn
--   take     op n min want lim1..limn (AllowN, or a peek with want 0)
--          n: the limits; lim "unit:per:cap" (unit: units per token, per:
--          units refilled per µs, cap: capacity in tokens); min: fewer
--          available denies and hands nothing; want: tokens to take at
--          most; gen: the call's number (a holder numbers its claims and
--          refunds in the order it makes them: a call with its record's
--          number is the same call sent again, one with a lower number
--          runs after a later call and does nothing); held: the tokens the
--          holder still holds (an upper bound); received: the total the
--          holder's replies have handed it; live: 1 if the holder's
--          record should be live (a grant reached it less than a lease
--          TTL ago, well within hold, and no refund ended it since), so
--          that an absent key means its state was lost (flushed, evicted,
--          a restart from empty), 0 if not; back: the leased tokens a
--          refund gives back (the holder holds none after it); give:
--          tokens spent that a refund gives back all the same (Settle's);
--          debt: 1 if what the level lacks of want is taken all the same,
--          the level going below empty, down to -cap at most (Settle's
--          take: the events happened), 0 if not; holder: never ':' or ';'
--          (the store checks).
--
-- Reply per call: {allowed, handed, then per limit: remaining, retry_us,
-- reset_us, as tokenbucket.lua's, then full, then cut}; handed is what the holder
-- receives: the undelivered (handed - received, what replies it never got
-- carried) and any fresh grant; for a refund, how many of its back tokens
-- every bucket took back. remaining is the level. full is 1 if every
-- bucket stands at its ceiling after the call (level + total >= cap):
-- nothing was taken from it since it last was full but what the records
-- still count (hybrid forgives the debt of a charge-back that finds it so).
-- cut is what a debt claim could not take, its level at -cap, the most of
-- any limit (0 for every other call).
--
-- A state written under another limit is refilled under it up to now, to
-- at most its capacity less every token the ledger holds, and converted
-- (bucket_convert in lib.lua): its tokens kept, capped at the new capacity.
-- A clock behind ts: the call is decided at ts, deadlines included; waits
-- and TTLs count from the clock the call read.
--
-- Invariants, per limit, with O the tokens its live records hold (L1-L5
-- in docs/design.md, "The lease ledger's protocol", with the proof):
--   L1 k + O <= cap and k >= -cap after every call (k <= 0 when O > cap;
--      k < 0 only by a debt claim), r < unit, and
--      r = 0 when k + O = cap; no call raises k + O at one instant, but
--      for a refund's give; the level rises by at most per units a µs;
--   L2 a holder may spend at most its live record's held less its
--      undelivered;
--   L3 total = the sum of the records' held;
--   L4 a denied call hands nothing, a call sent again nothing fresh, a
--      call older than its holder's record does nothing;
--   L5 every key has a TTL, and lives until the bucket is full after the
--      ledger's last deadline.

-- A record of the ledger: its whole text, holder, held, gen, deadline and
-- handed.
local record = '(;([^:;]+):(%d+):(%d+):(%d+):(%d+))'
local record_at = '^' .. record

-- parse_call reads the call at ARGV[j], whose keys follow KEYS[kj], into a
-- named table, and returns it and the indexes of the next call. Limit i of
-- the call is at KEYS[c.kj + i] and ARGV[c.l + i - 1].
local function parse_call(j, kj)
  local op, n = ARGV[j], num(ARGV[j + 1])
  local c, l
  if op == 'claim' then
    l = j + 10
    c = {op = op, n = n, min = num(ARGV[j + 2]), want = num(ARGV[j + 3]), gen = num(ARGV[j + 4]),
      held = num(ARGV[j + 5]), received = num(ARGV[j + 6]), live = ARGV[j + 7] == '1',
      debt = ARGV[j + 8] == '1', holder = ARGV[j + 9], kj = kj, l = l}
  elseif op == 'refund' then
    l = j + 8
    c = {op = op, n = n, min = 0, back = num(ARGV[j + 2]), give = num(ARGV[j + 3]),
      gen = num(ARGV[j + 4]), received = num(ARGV[j + 5]), live = ARGV[j + 6] == '1', holder = ARGV[j + 7],
      kj = kj, l = l}
  elseif op == 'take' then
    l = j + 4
    c = {op = op, n = n, min = num(ARGV[j + 2]), want = num(ARGV[j + 3]), holder = '', kj = kj, l = l}
  else
    error('ledger.lua: unknown op ' .. tostring(op))
  end
  return c, l + n, kj + n
end

-- read_ledger reads b's ledger rest at b.now into b: its total, lo and hi,
-- the holder's record as b.mine (named fields), the other records' text in
-- b.before and b.after, and returns the dead records (deadline <= now),
-- dropped, as {deadline, held} pairs. Keeps L3: total is recounted
-- whenever a record is dropped.
local function read_ledger(b, rest, holder)
  local recs = ''
  if rest and rest ~= '' then
    local t, l, h, rs = match(rest, '^|(%d+):(%d+):(%d+)(.*)$')
    if t then b.total, b.lo, b.hi, recs = num(t), num(l), num(h), rs end
  end
  if recs == '' then return nil end
  if b.lo > b.now then
    -- No deadline has passed: only the holder's record is read.
    b.before = recs
    local i = holder ~= '' and find(recs, ';' .. holder .. ':', 1, true)
    if not i then return nil end
    local rec, _, a, g, d, x = match(recs, record_at, i)
    if rec then
      b.mine = {text = rec, held = num(a), gen = num(g), deadline = num(d), handed = num(x)}
      b.before, b.after = sub(recs, 1, i - 1), sub(recs, i + #rec)
    end
    return nil
  end
  local dead, live, was_hi = nil, {}, b.hi
  b.total, b.lo, b.hi = 0, 0, 0
  for rec, h, a, g, d, x in gmatch(recs, record) do
    local held, deadline = num(a), num(d)
    b.total = b.total + held
    if deadline <= b.now then
      if dead then dead[#dead + 1] = {deadline, held} else dead = {{deadline, held}} end
    else
      if deadline > b.hi then b.hi = deadline end
      if b.lo == 0 or deadline < b.lo then b.lo = deadline end
      if h == holder then
        b.mine = {text = rec, held = held, gen = num(g), deadline = deadline, handed = num(x)}
      else
        live[#live + 1] = rec
      end
    end
  end
  b.before = table.concat(live)
  -- hi stays the latest deadline a grant set, dropped record or not: the
  -- key lives until then (L5), which Claim.Live relies on.
  if was_hi > b.hi and was_hi > b.now then b.hi = was_hi end
  return dead
end

-- read_bucket returns limit i's bucket of call c, refilled up to clock (or
-- its ts) and its ledger read. Keeps L1: the level refills up to capacity
-- less the records, the ceiling rising at each dead record's deadline in
-- time order (the level never jumps).
local function read_bucket(c, i, clock)
  local lim = ARGV[c.l + i - 1]
  local unit, per, cap = tb_limit(lim)
  local b = {unit = unit, per = per, cap = cap, k = 0, r = 0, now = clock,
    total = 0, lo = 0, hi = 0, dirty = false, mine = false, before = '', after = '', rec = false, u = 0,
    cut = 0}
  local k, r, ts, old, rest = bucket_get(KEYS[c.kj + i])
  if ts and ts > b.now then b.now = ts end
  local dead = read_ledger(b, rest, c.holder)
  local total = b.total
  if k and old ~= lim then
    k, r, ts = bucket_convert(k, r, ts, old, b.now, unit, cap, total)
    b.dirty = true
  end
  if not k and c.live then
    -- Lost state: the key lived until its records' deadlines (L5), so
    -- Redis lost it while this holder's record was live. The fleet can
    -- prove no level: the bucket starts again empty, not full, and is
    -- written so that it refills from now.
    k, r, ts, b.dirty = 0, 0, b.now, true
  elseif not k then
    k, r, ts = max(cap - total, 0), 0, b.now
  elseif k >= max(cap - total, 0) then
    -- Above the ceiling (records written under a larger capacity): down
    -- to it. A level below empty stays: a debt is repaid by the refill,
    -- never forgiven because the records exceed a lowered capacity.
    k, r = max(cap - total, 0), 0
  end
  if dead then
    if #dead > 1 then table.sort(dead, function(x, y) return x[1] < y[1] end) end
    for _, x in ipairs(dead) do
      if x[1] > ts then
        k, r = fill(k, r, x[1] - ts, unit, per, cap - total)
        ts = x[1]
      end
      total = total - x[2]
    end
    b.dirty = true
  end
  b.k, b.r = fill(k, r, b.now - ts, unit, per, cap - total)
  b.total = total
  return b
end

-- set_record writes the holder's record in b: held, gen, deadline, handed.
-- A record that holds nothing stays until its deadline, for its gen: calls
-- queued on different connections run in any order once a paused Redis
-- resumes, and a claim older than the refund that emptied the record must
-- still find it and do nothing (L4); past the deadline it goes. Keeps L3.
local function set_record(b, c, held, deadline, handed)
  local was = 0
  if b.mine then was = b.mine.held end
  b.total = b.total - was + held
  if held > 0 or deadline > b.now then
    if deadline > b.hi then b.hi = deadline end
    if b.lo == 0 or deadline < b.lo then b.lo = deadline end
    b.rec = format(';%s:%d:%d:%d:%d', c.holder, held, c.gen, deadline, handed)
  else
    b.rec = ''
  end
  b.dirty = true
end

-- claim decides claim c on its buckets B at hold and returns allowed and
-- what it hands. Keeps L2: a record covers what its holder may spend plus
-- its undelivered, lowered to what the holder says it holds, raised only
-- by a fresh grant taken from the level; anything handed sets a new
-- deadline (the holder spends for less than hold from its reply). Keeps
-- L4: a call older than the record does nothing, one sent again (its
-- record's gen) takes nothing fresh, a denied one hands nothing.
local function claim(c, B, hold)
  local want = c.want
  for i = 1, c.n do
    local m = B[i].mine
    if m and m.gen > c.gen then return 0, 0 end
    if m and m.gen == c.gen then want = 0 end
  end
  -- What each record holds that the holder never received: handed -
  -- received (at least 0: a record an old call wrote may count less).
  local u, fresh = nil, want
  for i = 1, c.n do
    local b = B[i]
    if b.mine then b.u = max(b.mine.handed - c.received, 0) end
    if u == nil or b.u < u then u = b.u end
    if b.k < fresh then fresh = b.k end
  end
  if fresh < 0 then fresh = 0 end -- a level in debt grants nothing
  local allowed = 1
  if u + fresh < c.min then allowed, u, fresh = 0, 0, 0 end
  local hand = u + fresh
  for i = 1, c.n do
    local b = B[i]
    local m = b.mine
    local held, deadline, handed = fresh, 0, c.received
    if m then
      held = min(m.held, c.held + b.u) + fresh
      deadline, handed = m.deadline, max(m.handed, c.received)
    end
    if hand > 0 then deadline = b.now + hold end
    b.k = b.k - fresh
    if fresh > 0 then b.dirty = true end
    local debt = c.debt and want > fresh
    if debt then
      -- What the level lacks goes into debt: the level falls below
      -- empty, to -cap at most (the rest is forgiven). The record holds
      -- only the fresh tokens: the debt is the level's, which refills it.
      -- The record stays for at least hold, holding nothing if need be,
      -- so that the claim sent again finds its gen and takes no more.
      b.k = b.k - (want - fresh)
      if b.k < -b.cap then b.cut, b.k, b.r = -b.cap - b.k, -b.cap, 0 end
      b.dirty = true
      deadline = max(deadline, b.now + hold)
    end
    if m or held > 0 or debt then set_record(b, c, held, deadline, handed + fresh) end
  end
  return allowed, hand
end

-- refund applies refund c to its buckets B and returns how many of its
-- back tokens every bucket took back (the rest stay debited until the
-- level refills them: the caller counts them lost). Keeps L1 and L2: only
-- a live record of an earlier call gives tokens back, at most its held
-- (what it moves to the level leaves the ledger), and ends it; give, spent
-- tokens given back, refills up to the ceiling as any refund does, once:
-- a record of the refund's gen or a later one says that it ran already
-- (go-redis sent it again, its marker gone) or that a later call of the
-- holder ran first, and it gives nothing. So a refund always leaves its
-- holder's record, holding nothing, for at least hold when it finds none
-- (past its deadline, say): a claim of the holder's sent before it and
-- run after it then finds a later gen and does nothing, where it would
-- otherwise make a record of a fresh grant its holder never gets.
local function refund(c, B, hold)
  local took = c.back
  for i = 1, c.n do
    local b = B[i]
    local m, back, mine = b.mine, 0, 0
    if not m or m.gen < c.gen then
      back = c.give
      local deadline = 0
      if m then
        mine = min(c.back + max(m.handed - c.received, 0), m.held)
        back = back + mine
        deadline = m.deadline
      end
      if not m or c.give > 0 then deadline = max(deadline, b.now + hold) end
      -- Nothing is left undelivered: what was went back with mine.
      set_record(b, c, 0, deadline, c.received)
    end
    if mine < took then took = mine end
    if back > 0 then
      local ceil = max(b.cap - b.total, 0)
      if b.k + back >= ceil then b.k, b.r = ceil, 0 else b.k = b.k + back end
      b.dirty = true
    end
  end
  return took
end

-- take takes between c.min and c.want tokens from the level of every
-- bucket of B, or none, and returns allowed and what it took: no record
-- changes (L2).
local function take(c, B)
  local got = c.want
  for i = 1, c.n do
    if B[i].k < got then got = B[i].k end
  end
  if got < c.min then return 0, 0 end
  for i = 1, c.n do
    B[i].k = B[i].k - got
    if got > 0 then B[i].dirty = true end
  end
  return 1, got
end

-- finish writes every changed bucket of B and appends call c's reply to
-- reply.
-- Keeps L5: the TTL outlasts the last deadline plus the time the level
-- takes to fill; a state with no record is tokenbucket.lua's.
local function finish(reply, c, B, clock, allowed, hand)
  reply[#reply + 1] = allowed
  reply[#reply + 1] = hand
  local full, cut = 1, 0
  for i = 1, c.n do
    local b = B[i]
    local key, lim = KEYS[c.kj + i], ARGV[c.l + i - 1]
    local lag = b.now - clock
    local reset = lag + wait_us(b.k, b.r, b.cap, b.unit, b.per)
    if b.dirty then
      -- One concatenation: a ledger of many holders is long, and each
      -- string built costs its length.
      local rec = b.rec
      if not rec then
        rec = ''
        if b.mine then rec = b.mine.text end
      end
      if b.before == '' and rec == '' and b.after == '' and b.hi <= b.now then
        bucket_put(key, b.k, b.r, b.now, b.cap, reset, lim)
      else
        put(key, format('%d:%d:%d:%s|%d:%d:%d', b.k, b.r, b.now, lim, b.total, b.lo, b.hi) ..
          b.before .. rec .. b.after, max(b.hi - b.now, 0) + reset)
      end
    end
    local retry = 0
    if allowed == 0 then retry = lag + wait_us(b.k, b.r, c.min, b.unit, b.per) end
    reply[#reply + 1] = b.k
    reply[#reply + 1] = retry
    reply[#reply + 1] = reset
    if b.k + b.total < b.cap then full = 0 end
    if b.cut > cut then cut = b.cut end
  end
  reply[#reply + 1] = full
  reply[#reply + 1] = cut
end

-- The calls, each read, decided by its op and written in turn.
local clock, hold, batch = now_us(), num(ARGV[2]), ARGV[3] == 'batch'
local out, j, kj = {}, 3, 0
if batch then j = 4 end
while j <= #ARGV do
  local c
  c, j, kj = parse_call(j, kj)
  local marker
  if not batch and c.op == 'refund' then
    marker = KEYS[c.n + 1]
    if not once(marker) then
      c.back, c.give, marker = 0, 0, nil -- this refund ran already
    end
  end
  local B = {}
  for i = 1, c.n do B[i] = read_bucket(c, i, clock) end
  local allowed, hand = 1, 0
  if c.op == 'claim' then
    allowed, hand = claim(c, B, hold)
  elseif c.op == 'refund' then
    hand = refund(c, B, hold)
    done(marker, hand)
  else
    allowed, hand = take(c, B)
  end
  finish(out, c, B, clock, allowed, hand)
end
return out
