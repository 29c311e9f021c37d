package xrate

import (
	"errors"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// model is the bucket in big.Int arithmetic: no product can overflow.
type model struct {
	unit, per, cap *big.Int
	tokens, rem    *big.Int
	last           time.Time
	limit          tierlimit.Limit
}

func newModel(limit tierlimit.Limit, tokens int64, now time.Time) *model {
	m := &model{last: now}
	m.set(limit)
	m.tokens = big.NewInt(max(0, min(tokens, limit.Capacity())))
	m.rem = new(big.Int)
	return m
}

func (m *model) set(limit tierlimit.Limit) {
	unit, per := limit.Scale()
	m.limit, m.unit, m.per, m.cap = limit, big.NewInt(unit), big.NewInt(per), big.NewInt(limit.Capacity())
}

func (m *model) full() bool { return m.tokens.Cmp(m.cap) >= 0 }

// advance: whole µs since last refill per units each; a full bucket's
// refill starts from now.
func (m *model) advance(now time.Time) {
	d := now.Sub(m.last) / time.Microsecond
	if d <= 0 {
		if m.full() && now.After(m.last) {
			m.last = now
		}
		return
	}
	if m.full() {
		m.last = now
		return
	}
	m.last = m.last.Add(d * time.Microsecond)
	units := new(big.Int).Mul(big.NewInt(int64(d)), m.per)
	units.Add(units, m.rem)
	q, r := new(big.Int).QuoRem(units, m.unit, new(big.Int))
	m.tokens.Add(m.tokens, q)
	m.rem = r
	if m.full() {
		m.tokens.Set(m.cap)
		m.rem.SetInt64(0)
		m.last = now
	}
}

func (m *model) follow(now time.Time, limit tierlimit.Limit) {
	m.advance(now)
	oldUnit := m.unit
	m.set(limit)
	if m.full() {
		m.tokens.Set(m.cap)
		m.rem.SetInt64(0)
		return
	}
	m.rem.Quo(new(big.Int).Mul(m.rem, m.unit), oldUnit)
}

// wait: ceil(((k - tokens)·unit - rem) / per) µs after last, less now.
func (m *model) wait(now time.Time, k int64) time.Duration {
	need := new(big.Int).Sub(big.NewInt(k), m.tokens)
	if need.Sign() <= 0 {
		return 0
	}
	need.Mul(need, m.unit).Sub(need, m.rem)
	need.Add(need, m.per).Sub(need, big.NewInt(1)).Quo(need, m.per)
	if !need.IsInt64() || need.Int64() > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return max(0, m.last.Add(time.Duration(need.Int64())*time.Microsecond).Sub(now))
}

func (m *model) decide(now time.Time, n int64) tierlimit.Result {
	res := tierlimit.Result{Limit: m.limit, Source: tierlimit.SourceLocal}
	res.Allowed = n == 0 || m.tokens.Cmp(big.NewInt(n)) >= 0
	if res.Allowed {
		m.tokens.Sub(m.tokens, big.NewInt(n))
	} else {
		res.RetryAfter = m.wait(now, n)
	}
	res.Remaining = m.tokens.Int64()
	res.ResetAfter = m.wait(now, m.cap.Int64())
	return res
}

// settle gives back charged-used, capped at the capacity, or takes
// used-charged, the level floored at zero.
func (m *model) settle(now time.Time, charged, used int64) tierlimit.Result {
	m.advance(now)
	m.tokens.Add(m.tokens, big.NewInt(charged))
	m.tokens.Sub(m.tokens, big.NewInt(used))
	switch {
	case m.full():
		m.tokens.Set(m.cap)
		m.rem.SetInt64(0)
	case m.tokens.Sign() < 0:
		m.tokens.SetInt64(0)
		m.rem.SetInt64(0)
	}
	return tierlimit.Result{Allowed: true, Limit: m.limit, Remaining: m.tokens.Int64(),
		ResetAfter: m.wait(now, m.cap.Int64()), Source: tierlimit.SourceLocal}
}

// level returns tokens + rem/unit.
func (m *model) level() *big.Rat {
	r := new(big.Rat).SetFrac(m.rem, m.unit)
	return r.Add(r, new(big.Rat).SetInt(m.tokens))
}

// fuzzLimit folds fuzz input into the ranges of a Limit (values in range
// are kept), or reports false when the limit is still invalid (it takes
// too long to fill).
func fuzzLimit(rate, periodMicros, burst int64) (tierlimit.Limit, bool) {
	l := tierlimit.Limit{
		Rate:   1 + fold(rate-1, tierlimit.MaxRate),
		Period: time.Duration(1+fold(periodMicros-1, int64(tierlimit.MaxPeriod/time.Microsecond))) * time.Microsecond,
		Burst:  fold(burst, tierlimit.MaxRate+1),
	}
	return l, l.Validate() == nil
}

// fold maps v into [0, m).
func fold(v, m int64) int64 { return int64(uint64(v) % uint64(m)) }

// FuzzSetLimit checks DecideLimit's change of limit (refill under the old
// limit up to now, tokens kept and capped at the new capacity, the part of
// a token carried into the new units), the decision and the Settle after
// it against the big.Int model, and that a change never adds to the
// level: it is min(old level, new capacity), less under one new unit.
func FuzzSetLimit(f *testing.F) {
	f.Add(int64(100), int64(1_000_000), int64(0), int64(1000), int64(1_000_000), int64(0), int64(0), int64(0), int64(1), int64(1500), int64(3), int64(1))
	f.Add(int64(4), int64(1_000_000), int64(0), int64(2), int64(1_000_000), int64(0), int64(0), int64(375_000_000), int64(2), int64(0), int64(3), int64(1))
	f.Add(int64(1_000_003), int64(86_400_000_000), int64(0), int64(7), int64(3), int64(1), int64(5), int64(86_399_740), int64(1), int64(999), int64(3), int64(1))
	f.Add(int64(tierlimit.MaxRate), int64(1), int64(0), int64(999_999_999_989), int64(1_125_899_906_842_623), int64(1e12), int64(tierlimit.MaxRate-3), int64(1_999), int64(tierlimit.MaxRate), int64(1e12), int64(3), int64(1))
	f.Fuzz(func(t *testing.T, r1, p1, b1, r2, p2, b2, tokens, before, n, after, charged, used int64) {
		l1, ok1 := fuzzLimit(r1, p1, b1)
		l2, ok2 := fuzzLimit(r2, p2, b2)
		if !ok1 || !ok2 {
			t.Skip()
		}
		before, after = fold(before, math.MaxInt64/2), fold(after, math.MaxInt64/2)
		n = max(0, min(n, l2.Capacity()))
		b, m := NewWith(l1, tokens, t0), newModel(l1, tokens, t0)
		t1 := t0.Add(time.Duration(before))
		// An old-limit decision first, so the change meets a remainder.
		b.Decide(t1, 1)
		m.advance(t1)
		m.decide(t1, 1)
		m.advance(t1)
		old := m.level()
		res, err := b.DecideLimit(t1, l2, 0)
		if err != nil {
			t.Fatal(err)
		}
		m.follow(t1, l2)
		if want := m.decide(t1, 0); res != want {
			t.Fatalf("DecideLimit(t1, %v, 0) = %+v, model %+v", l2, res, want)
		}
		k, u := b.Level(t1)
		if k != m.tokens.Int64() || u != m.rem.Int64() {
			t.Fatalf("Level after the change = %d, %d; model %v, %v", k, u, m.tokens, m.rem)
		}
		capped := old
		if c := new(big.Rat).SetInt(m.cap); c.Cmp(old) < 0 {
			capped = c
		}
		gap := new(big.Rat).Sub(capped, m.level())
		if gap.Sign() < 0 || gap.Cmp(new(big.Rat).SetFrac(big.NewInt(1), m.unit)) >= 0 {
			t.Fatalf("level %v after the change, want min(%v, %d) less under one unit", m.level(), old, l2.Capacity())
		}
		t2 := t1.Add(time.Duration(after))
		res, err = b.DecideLimit(t2, l2, n)
		if err != nil {
			t.Fatal(err)
		}
		m.advance(t2)
		if want := m.decide(t2, n); res != want {
			t.Fatalf("DecideLimit(t1+%v, %d) = %+v, model %+v", time.Duration(after), n, res, want)
		}
		charged, used = fold(charged, l2.Capacity()+1), fold(used, l2.Capacity()+1)
		res, err = b.Settle(t2, l2, charged, used)
		if err != nil {
			t.Fatal(err)
		}
		if want := m.settle(t2, charged, used); res != want {
			t.Fatalf("Settle(t1+%v, %d, %d) = %+v, model %+v", time.Duration(after), charged, used, res, want)
		}
	})
}

// TestDecideLimitChecks: a bad limit or cost leaves the bucket as it was.
func TestDecideLimitChecks(t *testing.T) {
	l := tierlimit.PerSecond(10)
	b := NewWith(l, 5, t0)
	for _, c := range []struct {
		limit tierlimit.Limit
		n     int64
		want  error
	}{
		{tierlimit.Limit{}, 1, tierlimit.ErrInvalidLimit},
		{tierlimit.PerSecond(-1), 1, tierlimit.ErrInvalidLimit},
		{l, 11, tierlimit.ErrInvalidCost},
		{tierlimit.PerSecond(3), 4, tierlimit.ErrInvalidCost},
		{l, -1, tierlimit.ErrInvalidCost},
	} {
		if _, err := b.DecideLimit(t0, c.limit, c.n); !errors.Is(err, c.want) {
			t.Errorf("DecideLimit(%v, %d) = %v, want %v", c.limit, c.n, err, c.want)
		}
		if got := b.Limit(); got != l {
			t.Errorf("after a refused DecideLimit(%v, %d): Limit() = %v, want %v", c.limit, c.n, got, l)
		}
		if k, _ := b.Level(t0); k != 5 {
			t.Errorf("after a refused DecideLimit(%v, %d): %d tokens, want 5", c.limit, c.n, k)
		}
	}
}

// TestSettle steps a bucket of 10/s through corrections: back by the
// difference, capped at the capacity; more by the difference, floored at
// empty, the part of the next token included.
func TestSettle(t *testing.T) {
	l := tierlimit.PerSecond(10) // a token every 100 ms
	b := NewWith(l, 2, t0)
	steps := []struct {
		at            time.Duration
		charged, used int64
		tokens, units int64
		reset         time.Duration
	}{
		{0, 5, 3, 4, 0, 600 * time.Millisecond},
		{0, 3, 3, 4, 0, 600 * time.Millisecond},
		{50 * time.Millisecond, 2, 5, 1, 50_000, 850 * time.Millisecond},
		{50 * time.Millisecond, 0, 9, 0, 0, time.Second},
		{50 * time.Millisecond, 10, 0, 10, 0, 0},
		{50 * time.Millisecond, 10, 0, 10, 0, 0},
		{60 * time.Millisecond, 0, 4, 6, 0, 400 * time.Millisecond},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		res, err := b.Settle(now, l, s.charged, s.used)
		if err != nil {
			t.Fatal(err)
		}
		k, u := b.Level(now)
		if !res.Allowed || res.Remaining != s.tokens || k != s.tokens || u != s.units || res.ResetAfter != s.reset {
			t.Errorf("step %d: Settle(t0+%v, %d, %d) = %v, %d, reset %v, level %d+%d units; want true, %d, reset %v, level %d+%d",
				i, s.at, s.charged, s.used, res.Allowed, res.Remaining, res.ResetAfter, k, u, s.tokens, s.reset, s.tokens, s.units)
		}
	}
	for _, c := range [][2]int64{{-1, 0}, {0, -1}, {11, 0}, {0, 11}} {
		if _, err := b.Settle(t0, l, c[0], c[1]); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("Settle(%d, %d) = %v, want ErrInvalidCost", c[0], c[1], err)
		}
	}
	if _, err := b.Settle(t0, tierlimit.Limit{Rate: 1}, 0, 0); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("Settle under a zero period = %v, want ErrInvalidLimit", err)
	}
}

// TestDecideAll: all or nothing, each bucket at its own limit, and the
// most restrictive take's Result.
func TestDecideAll(t *testing.T) {
	user, org := tierlimit.PerSecond(100), tierlimit.PerSecond(20)
	u1, u2, o := New(user, t0), New(user, t0), NewWith(org, 3, t0)
	takes := func(n1, n2, no int64) []Take {
		return []Take{{u1, user, n1}, {u2, user, n2}, {o, org, no}}
	}
	res, err := DecideAll(t0, takes(1, 1, 2))
	if err != nil || !res.Allowed || res.Remaining != 1 || res.Limit != org {
		t.Errorf("DecideAll(1, 1, 2) = %+v, %v; want allowed, the org's Remaining 1", res, err)
	}
	res, err = DecideAll(t0, takes(1, 101, 2))
	if err == nil || !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("DecideAll over a capacity = %+v, %v; want ErrInvalidCost", res, err)
	}
	// The org lacks 1 token (50 ms), u2 lacks 2 (20 ms): the org's denial.
	u2.Decide(t0, 98)
	res, err = DecideAll(t0, takes(5, 3, 2))
	if err != nil || res.Allowed || res.RetryAfter != 50*time.Millisecond || res.Limit != org || res.Remaining != 1 {
		t.Errorf("DecideAll(5, 3, 2) = %+v, %v; want denied by the org, 50ms", res, err)
	}
	for _, c := range []struct {
		b    *Bucket
		want int64
	}{{u1, 99}, {u2, 1}, {o, 1}} {
		if k, _ := c.b.Level(t0); k != c.want {
			t.Errorf("after a refused DecideAll: %d tokens, want %d (nothing charged)", k, c.want)
		}
	}
	// 20 ms later the org has 1.4, u2 3: the org still lacks 0.6 (30 ms).
	res, _ = DecideAll(t0.Add(20*time.Millisecond), takes(5, 3, 2))
	if res.Allowed || res.RetryAfter != 30*time.Millisecond {
		t.Errorf("DecideAll 20ms later = %v, %v; want denied, 30ms", res.Allowed, res.RetryAfter)
	}
	if _, err := DecideAll(t0, nil); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("DecideAll() = %v, want ErrInvalidCost", err)
	}
	if _, err := DecideAll(t0, []Take{{u1, tierlimit.Limit{}, 1}}); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("DecideAll(zero limit) = %v, want ErrInvalidLimit", err)
	}
}
