package xrate

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

var t0 = time.Unix(1_700_000_000, 0)

// TestDecideSequence steps a prime daily quota through fixed instants:
// each refill is floor of the elapsed µs × Rate / Period, the remainder
// carried from one call to the next.
func TestDecideSequence(t *testing.T) {
	limit := tierlimit.PerDay(1_000_003) // one token every 86,399.74 µs
	b := NewWith(limit, 0, t0)
	steps := []struct {
		at        time.Duration // since t0
		n         int64
		allowed   bool
		remaining int64
		retry     time.Duration
	}{
		{0, 1, false, 0, 86_400 * time.Microsecond},
		{86_399 * time.Microsecond, 1, false, 0, time.Microsecond},
		{86_400 * time.Microsecond, 1, true, 0, 0},
		// 3 tokens by 259,200 µs (3 × 86,399.74 = 259,199.2), one taken.
		{259_200 * time.Microsecond, 0, true, 2, 0},
		{259_200 * time.Microsecond, 3, false, 2, 86_399 * time.Microsecond},
		{345_599 * time.Microsecond, 3, true, 0, 0},
		// A clock that steps back refills nothing and waits from the last
		// decision: the 5th token comes at 431,999 µs (5 × 86,399.74).
		{345_000 * time.Microsecond, 1, false, 0, 86_999 * time.Microsecond},
	}
	for i, s := range steps {
		res := b.Decide(t0.Add(s.at), s.n)
		if res.Allowed != s.allowed || res.Remaining != s.remaining || res.RetryAfter != s.retry {
			t.Errorf("step %d: Decide(t0+%v, %d) = %v, %d, %v; want %v, %d, %v",
				i, s.at, s.n, res.Allowed, res.Remaining, res.RetryAfter, s.allowed, s.remaining, s.retry)
		}
	}
}

// TestSetLimitKeepsTokens checks that SetLimit keeps the tokens and the
// part of a token refilled under the old limit, capped at the new burst.
func TestSetLimitKeepsTokens(t *testing.T) {
	b := NewWith(tierlimit.PerSecond(4), 0, t0)
	// 375 ms at 4/s: 1.5 tokens.
	b.SetLimit(t0.Add(375*time.Millisecond), tierlimit.PerSecond(2))
	if k, units := b.Level(t0.Add(375 * time.Millisecond)); k != 1 || units != 250_000 {
		t.Errorf("Level after SetLimit = %d, %d units, want 1, 250000 (half a token of 500000)", k, units)
	}
	// Half a token at 2/s is 250 ms away.
	if res := b.Decide(t0.Add(375*time.Millisecond), 2); res.Allowed || res.RetryAfter != 250*time.Millisecond {
		t.Errorf("Decide(2) = %v, %v; want false, 250ms", res.Allowed, res.RetryAfter)
	}
	b.SetLimit(t0.Add(10*time.Second), tierlimit.PerSecond(2).WithBurst(1))
	if res := b.Decide(t0.Add(10*time.Second), 0); res.Remaining != 1 || res.ResetAfter != 0 {
		t.Errorf("Decide(0) after a smaller burst = %d, reset %v; want 1, 0", res.Remaining, res.ResetAfter)
	}
}

// TestLargeLimits checks waits where x/time/rate's float64 tokens round:
// 10^12 a second with a burst of 10^12, and a burst of 10^15 per µs.
func TestLargeLimits(t *testing.T) {
	l := tierlimit.PerSecond(1_000_000_000_000)
	b := NewWith(l, 0, t0)
	if res := b.Decide(t0, 1_000_000_000_000); res.RetryAfter != time.Second {
		t.Errorf("Decide(10^12) empty: RetryAfter %v, want 1s", res.RetryAfter)
	}
	if res := b.Decide(t0.Add(time.Microsecond), 1_000_001); res.Allowed || res.Remaining != 1_000_000 || res.RetryAfter != time.Microsecond {
		t.Errorf("Decide(1000001) after 1µs = %v, %d, %v; want false, 1000000, 1µs", res.Allowed, res.Remaining, res.RetryAfter)
	}
	m := tierlimit.Limit{Rate: tierlimit.MaxRate, Period: time.Microsecond}
	b = NewWith(m, tierlimit.MaxRate-1, t0)
	if res := b.Decide(t0, tierlimit.MaxRate); res.Allowed || res.RetryAfter != time.Microsecond || res.ResetAfter != time.Microsecond {
		t.Errorf("Decide(MaxRate) one short = %v, %v, %v; want false, 1µs, 1µs", res.Allowed, res.RetryAfter, res.ResetAfter)
	}
}

// TestNewState reads a Redis token bucket's state: k tokens (negative in
// debt) and r units.
func TestNewState(t *testing.T) {
	l := tierlimit.PerSecond(4) // unit 250,000
	b := NewState(l, 1, 200_000, t0)
	if k, units := b.Level(t0.Add(50 * time.Millisecond)); k != 2 || units != 0 {
		t.Errorf("Level 50ms later = %d, %d; want 2, 0", k, units)
	}
	if k, units := NewState(l, 9, 5, t0).Level(t0); k != 4 || units != 0 {
		t.Errorf("Level of an overfull state = %d, %d; want 4, 0", k, units)
	}
	// Debt (tokenbucket.lua's settle): -3 and 0.8 of a token, then 50 ms.
	if k, units := NewState(l, -3, 200_000, t0).Level(t0.Add(50 * time.Millisecond)); k != -2 || units != 0 {
		t.Errorf("Level of a state in debt 50ms later = %d, %d; want -2, 0", k, units)
	}
	if k, units := NewState(l, -9, 5, t0).Level(t0); k != -4 || units != 0 {
		t.Errorf("Level of a state past the floor = %d, %d; want -4, 0", k, units)
	}
}

// TestFullBucketRefillsFromTheDrain: a full bucket refills from the instant
// it is taken from, not from the last whole microsecond before it (which
// would admit up to a microsecond of the rate early: a million tokens at
// 10^12 a second).
func TestFullBucketRefillsFromTheDrain(t *testing.T) {
	for _, limit := range []tierlimit.Limit{tierlimit.PerSecond(1), tierlimit.PerSecond(1_000_000_000_000)} {
		b := New(limit, t0)
		drain := t0.Add(1500 * time.Nanosecond)
		if res := b.Decide(drain, limit.Capacity()); !res.Allowed {
			t.Fatalf("%v: draining a full bucket = %+v, want allowed", limit, res)
		}
		res := b.Decide(drain, 1)
		if want := limit.RefillTime(1).Round(time.Microsecond); res.Allowed || res.RetryAfter != max(want, time.Microsecond) {
			t.Errorf("%v: right after the drain = allowed %v, RetryAfter %v; want denied, %v", limit, res.Allowed, res.RetryAfter, max(want, time.Microsecond))
		}
		if res := b.Decide(drain.Add(999*time.Nanosecond), 1); res.Allowed {
			t.Errorf("%v: 999ns after the drain = allowed, want denied: less than a µs of refill", limit)
		}
	}
}
