// Package xrate is the in-process tiers' token bucket (local, and hybrid's
// fallback): golang.org/x/time/rate's bucket, which it replaced, in exact
// integer arithmetic, reporting each decision as a tierlimit.Result.
//
// x/time/rate counts tokens in float64: at 10^8 events a second a bucket
// gains or loses whole tokens to rounding, and its waits drift. Bucket
// counts whole tokens and a remainder in 1/unit of a token, where one
// token is unit units and a microsecond refills per units
// (tierlimit.Limit.Scale), the Redis token bucket's arithmetic; products
// pass 64 bits in math/bits' 128.
package xrate

import (
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
)

// Bucket is one key's token bucket. It is safe for concurrent use and must
// not be copied. Its limit must be valid (tierlimit.Limit.Validate).
//
// The limit and its scale, which a decision only reads, come before the
// lock and the level, which it writes: a holder can then keep them on
// separate cache lines (local's entry, TestEntryLayout there).
type Bucket struct {
	limit  tierlimit.Limit
	unit   uint64 // units per token
	per    uint64 // units refilled per µs
	cap    uint64 // capacity in tokens
	mu     sync.Mutex
	tokens uint64 // whole tokens, <= cap
	owed   uint64 // whole tokens of debt (Settle), <= cap; tokens == 0 when owed > 0
	rem    uint64 // units of the next token, < unit; 0 when tokens == cap
	last   int64  // ns, on the clock of the callers' times (time.Time.UnixNano)
}

// The level of a Bucket is tokens - owed + rem/unit tokens: from -cap
// (owed == cap, rem == 0) to cap. Only Settle takes it below empty (debt);
// a Bucket that is never settled into debt keeps owed == 0 and decides as
// x/time/rate's bucket does.

// New returns a full Bucket of limit.
func New(limit tierlimit.Limit, now time.Time) *Bucket {
	return NewWith(limit, limit.Capacity(), now)
}

// NewWith returns a Bucket of limit that holds tokens at now (capped at
// the capacity; at least 0).
func NewWith(limit tierlimit.Limit, tokens int64, now time.Time) *Bucket {
	b := new(Bucket)
	b.init(limit, tokens, now.UnixNano())
	return b
}

// Init makes b a full Bucket of limit at now, as New does, for a Bucket
// held inside another value (one allocation for both). b must not be in
// use yet.
func (b *Bucket) Init(limit tierlimit.Limit, now time.Time) {
	b.init(limit, limit.Capacity(), now.UnixNano())
}

func (b *Bucket) init(limit tierlimit.Limit, tokens int64, now int64) {
	b.last = now
	b.setLimit(limit)
	b.tokens = uint64(max(0, min(tokens, limit.Capacity())))
}

// NewState returns a Bucket of limit in the state the Redis token bucket
// stores ("k:r:ts", lua/tokenbucket.lua): tokens whole tokens, negative in
// debt, and units of the next at at (tokens kept within [-capacity,
// capacity], units below one token).
func NewState(limit tierlimit.Limit, tokens, units int64, at time.Time) *Bucket {
	b := NewWith(limit, 0, at)
	b.setWhole(tokens)
	if b.tokens < b.cap && tokens >= -int64(b.cap) {
		b.rem = min(uint64(max(0, units)), b.unit-1)
	}
	return b
}

// Level returns the level of b at now: whole tokens, negative in debt
// (down to minus the capacity), and units (of Unit per token) of the next:
// the level is tokens + units/Unit.
func (b *Bucket) Level(t time.Time) (tokens, units int64) {
	now := t.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return b.whole(), int64(b.rem)
}

// whole returns b's whole tokens, negative in debt: tokens - owed.
func (b *Bucket) whole() int64 { return int64(b.tokens) - int64(b.owed) }

// setWhole sets b's whole tokens to k (negative: debt), clamped to [-cap,
// cap]: a level that reaches cap is cap, one below -cap is -cap.
func (b *Bucket) setWhole(k int64) {
	c := int64(b.cap)
	switch {
	case k >= c:
		b.tokens, b.owed, b.rem = b.cap, 0, 0
	case k < -c:
		b.tokens, b.owed, b.rem = 0, b.cap, 0
	case k >= 0:
		b.tokens, b.owed = uint64(k), 0
	default:
		b.tokens, b.owed = 0, uint64(-k)
	}
}

func (b *Bucket) setLimit(limit tierlimit.Limit) {
	unit, per := limit.Scale()
	b.limit, b.unit, b.per, b.cap = limit, uint64(unit), uint64(per), uint64(limit.Capacity())
}

// Limit returns the limit b follows.
func (b *Bucket) Limit() tierlimit.Limit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit
}

// SetLimit makes b follow limit from now on: it keeps the tokens it holds
// at now (capped at the new capacity), as x/time/rate's SetLimitAt and
// SetBurstAt do, and the part of a token it has refilled.
func (b *Bucket) SetLimit(t time.Time, limit tierlimit.Limit) {
	now := t.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.follow(now, limit)
}

// follow refills b under its limit up to now, then makes it follow limit:
// the tokens it holds are kept, capped at the new capacity, and the part
// of the next token is carried into the new units, rounded down. b.mu
// must be held.
func (b *Bucket) follow(now int64, limit tierlimit.Limit) {
	b.advance(now)
	if limit == b.limit {
		return
	}
	oldUnit := b.unit
	b.setLimit(limit)
	if b.tokens >= b.cap {
		b.tokens, b.rem = b.cap, 0
		return
	}
	if b.owed > b.cap {
		// Debt beyond the new capacity: the level floors at -cap.
		b.owed, b.rem = b.cap, 0
		return
	}
	// rem/oldUnit of a token in the new units, rounded down.
	hi, lo := bits.Mul64(b.rem, b.unit)
	b.rem, _ = bits.Div64(hi, lo, oldUnit)
}

// Decide takes n tokens at now if b holds them (n == 0 peeks, denied only
// in debt; n above the capacity is denied) and returns the decision with its Remaining,
// RetryAfter and ResetAfter, exact to the nanosecond of now.
func (b *Bucket) Decide(t time.Time, n int64) tierlimit.Result {
	now := t.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	var res tierlimit.Result
	b.decide(&res, now, n)
	return res
}

// decide is Decide on a bucket advanced to now, writing every field of
// res: a Result is eight words, and local's AllowN has decide fill in the
// one it returns rather than copy it up through each call between
// (bench/RESULTS.md). b.mu must be held.
func (b *Bucket) decide(res *tierlimit.Result, now int64, n int64) {
	*res = tierlimit.Result{Allowed: b.has(n), Limit: b.limit, Source: tierlimit.SourceLocal}
	if res.Allowed {
		b.tokens -= uint64(n)
	} else {
		res.RetryAfter = b.wait(now, uint64(n))
	}
	b.result(res, now)
}

// has reports whether b holds n tokens (n == 0: whether b is not in debt).
func (b *Bucket) has(n int64) bool { return b.owed == 0 && (n == 0 || n > 0 && uint64(n) <= b.tokens) }

// result fills in res's Remaining (0 in debt) and ResetAfter (which counts
// the debt) from b at now.
func (b *Bucket) result(res *tierlimit.Result, now int64) {
	res.Remaining = int64(b.tokens)
	res.ResetAfter = b.wait(now, b.cap)
}

// advance refills b up to now: the whole µs since last, which it then
// moves to (a fraction of a µs is carried), or, once b is full, to now: a
// full bucket's refill starts when it is next taken from, not up to a µs
// before. A clock behind last refills nothing.
func (b *Bucket) advance(now int64) {
	d := (now - b.last) / int64(time.Microsecond)
	if d <= 0 {
		if b.tokens >= b.cap && now > b.last {
			b.last = now
		}
		return
	}
	b.last += d * int64(time.Microsecond)
	if b.tokens >= b.cap {
		b.last = now
		return
	}
	// rem + d·per units (below 2^127: no carry out) make q whole tokens
	// and r units. b fills once q reaches what it lacks, cap + owed -
	// tokens (d then reaches micros(cap)); a quotient past 64 bits (hi >=
	// unit) is past that too. Debt is repaid first.
	hi, lo := bits.Mul64(uint64(d), b.per)
	var c uint64
	lo, c = bits.Add64(lo, b.rem, 0)
	hi += c
	if hi >= b.unit {
		b.tokens, b.owed, b.rem, b.last = b.cap, 0, 0, now
		return
	}
	q, r := bits.Div64(hi, lo, b.unit)
	if q >= b.cap+b.owed-b.tokens {
		b.tokens, b.owed, b.rem, b.last = b.cap, 0, 0, now
		return
	}
	if b.owed > 0 {
		if q < b.owed {
			b.owed, b.rem = b.owed-q, r
			return
		}
		q, b.owed = q-b.owed, 0
	}
	b.tokens, b.rem = b.tokens+q, r
}

// micros returns the µs from last until b holds m tokens:
// ceil(((m - tokens + owed)·unit - rem) / per), the debt counted, or
// MaxUint64 past 64 bits (a cost above the capacity).
func (b *Bucket) micros(m uint64) uint64 {
	if b.owed == 0 && m <= b.tokens {
		return 0
	}
	hi, lo := bits.Mul64(m+b.owed-b.tokens, b.unit)
	var c uint64
	lo, c = bits.Sub64(lo, b.rem, 0)
	hi -= c
	lo, c = bits.Add64(lo, b.per-1, 0)
	hi += c
	if hi >= b.per {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, b.per)
	return q
}

// wait returns the time from now until b holds m tokens.
func (b *Bucket) wait(now int64, m uint64) time.Duration {
	us := b.micros(m)
	if us > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return math.MaxInt64
	}
	return max(0, time.Duration(us)*time.Microsecond-time.Duration(now-b.last))
}
