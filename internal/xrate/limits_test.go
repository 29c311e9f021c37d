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

// Its tokens are the level's whole part, negative in debt (Settle), and
// rem the units of the next one: the level is tokens + rem/unit.
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
	if m.tokens.Cmp(new(big.Int).Neg(m.cap)) < 0 {
		m.floor()
		return
	}
	m.rem.Quo(new(big.Int).Mul(m.rem, m.unit), oldUnit)
}

// floor sets the level to -cap, the deepest debt.
func (m *model) floor() {
	m.tokens.Neg(m.cap)
	m.rem.SetInt64(0)
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
	res.Allowed = m.tokens.Cmp(big.NewInt(n)) >= 0 // a peek: a level of 0 or more
	if res.Allowed {
		m.tokens.Sub(m.tokens, big.NewInt(n))
	} else {
		res.RetryAfter = m.wait(now, n)
	}
	return m.result(now, res)
}

// result fills in Remaining (never negative) and ResetAfter.
func (m *model) result(now time.Time, res tierlimit.Result) tierlimit.Result {
	res.Remaining = max(0, m.tokens.Int64())
	res.ResetAfter = m.wait(now, m.cap.Int64())
	return res
}

// atMost grants min(n, whole tokens) when the level holds one whole token
// at least; else 0, denied, with the wait for one.
func (m *model) atMost(now time.Time, n int64) (int64, tierlimit.Result) {
	res := tierlimit.Result{Limit: m.limit, Source: tierlimit.SourceLocal}
	if m.tokens.Sign() <= 0 {
		res.RetryAfter = m.wait(now, 1)
		return 0, m.result(now, res)
	}
	g := min(n, m.tokens.Int64())
	m.tokens.Sub(m.tokens, big.NewInt(g))
	res.Allowed = true
	return g, m.result(now, res)
}

// settle gives back charged-used, capped at the capacity, or takes
// used-charged, into debt, the level floored at -cap.
func (m *model) settle(now time.Time, charged, used int64) tierlimit.Result {
	m.advance(now)
	m.tokens.Add(m.tokens, big.NewInt(charged))
	m.tokens.Sub(m.tokens, big.NewInt(used))
	switch {
	case m.full():
		m.tokens.Set(m.cap)
		m.rem.SetInt64(0)
	case m.tokens.Cmp(new(big.Int).Neg(m.cap)) < 0:
		m.floor()
	}
	return m.result(now, tierlimit.Result{Allowed: true, Limit: m.limit, Source: tierlimit.SourceLocal})
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
		// A second Settle taking as much again may put the bucket in debt;
		// then AllowAtMost's and a decision's answers, a little later.
		if _, err := b.Settle(t2, l2, 0, used); err != nil {
			t.Fatal(err)
		}
		m.settle(t2, 0, used)
		t3 := t2.Add(time.Duration(after % int64(l2.Period)))
		m.advance(t3)
		g, res, err := b.DecideAtMost(t3, l2, n+1)
		if wg, want := m.atMost(t3, n+1); err != nil || g != wg || res != want {
			t.Fatalf("DecideAtMost(t2+%v, %d) = %d, %+v, %v; model %d, %+v", t3.Sub(t2), n+1, g, res, err, wg, want)
		}
		res, err = b.DecideLimit(t3, l2, n)
		if want := m.decide(t3, n); err != nil || res != want {
			t.Fatalf("DecideLimit(t2+%v, %d) after AtMost = %+v, %v; model %+v", t3.Sub(t2), n, res, err, want)
		}
		k, u = b.Level(t3)
		if k != m.tokens.Int64() || u != m.rem.Int64() {
			t.Fatalf("Level at t3 = %d, %d; model %v, %v", k, u, m.tokens, m.rem)
		}
	})
}

// TestDebt: a bucket of 10/s settled into debt denies every cost, peeks
// included, with the exact wait until its level reaches the cost (the debt
// counted), and admits again once the refill has repaid it.
func TestDebt(t *testing.T) {
	l := tierlimit.PerSecond(10) // a token every 100 ms
	b := NewWith(l, 2, t0)
	if _, err := b.Settle(t0, l, 0, 7); err != nil { // 2 - 7: 5 in debt
		t.Fatal(err)
	}
	steps := []struct {
		at        time.Duration
		n         int64
		allowed   bool
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}{
		{0, 1, false, 0, 600 * time.Millisecond, 1500 * time.Millisecond},
		{0, 0, false, 0, 500 * time.Millisecond, 1500 * time.Millisecond},
		{0, 10, false, 0, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{250 * time.Millisecond, 0, false, 0, 250 * time.Millisecond, 1250 * time.Millisecond},
		{500 * time.Millisecond, 0, true, 0, 0, time.Second},
		{500 * time.Millisecond, 1, false, 0, 100 * time.Millisecond, time.Second},
		{650 * time.Millisecond, 1, true, 0, 0, 950 * time.Millisecond},
		{700 * time.Millisecond, 2, false, 1, 100 * time.Millisecond, 900 * time.Millisecond},
	}
	for i, s := range steps {
		res := b.Decide(t0.Add(s.at), s.n)
		if res.Allowed != s.allowed || res.Remaining != s.remaining || res.RetryAfter != s.retry || res.ResetAfter != s.reset {
			t.Errorf("step %d: Decide(t0+%v, %d) = %v, %d, retry %v, reset %v; want %v, %d, retry %v, reset %v",
				i, s.at, s.n, res.Allowed, res.Remaining, res.RetryAfter, res.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
		}
	}
	// DecideAll denies a take whose bucket is in debt below its N.
	b2 := New(l, t0)
	at := t0.Add(700 * time.Millisecond)
	if _, err := b.Settle(at, l, 0, 10); err != nil { // 1 - 10: 9 in debt
		t.Fatal(err)
	}
	res, err := DecideAll(at, []Take{{b2, l, 1}, {b, l, 0}})
	if err != nil || res.Allowed || res.RetryAfter != 900*time.Millisecond {
		t.Errorf("DecideAll(full 1, 9 in debt 0) = %+v, %v; want denied, retry 900ms", res, err)
	}
	if k, _ := b2.Level(at); k != 10 {
		t.Errorf("after a refused DecideAll: %d tokens, want 10", k)
	}
	if _, err := b.Settle(at, l, 0, 10); err != nil { // -19 floors at -10
		t.Fatal(err)
	}
	if k, u := b.Level(at); k != -10 || u != 0 {
		t.Errorf("level after a take of 10 from -9 = %d+%d units, want -10 (the floor)", k, u)
	}
}

// TestDecideAtMost: between 1 and n, as many whole tokens as the bucket
// holds, n above the capacity too; none, with the exact wait for one whole
// token, when it holds a part of one or is in debt.
func TestDecideAtMost(t *testing.T) {
	l := tierlimit.PerSecond(3).WithBurst(5)
	b := New(l, t0)
	third := 333_333 * time.Microsecond // a token is 10^6 units, 3 a µs: 999,999 units
	steps := []struct {
		at        time.Duration
		settle    int64 // taken by a Settle first (0: none)
		n         int64
		granted   int64
		remaining int64
		retry     time.Duration
	}{
		{0, 0, 2, 2, 3, 0},
		{0, 0, 100, 3, 0, 0}, // above the burst: what it holds
		{0, 0, 1, 0, 0, 333_334 * time.Microsecond},
		// 1/3 s later: 333333 µs refilled 0.999999 of a token.
		{third, 0, 7, 0, 0, time.Microsecond},
		{third + time.Microsecond, 0, 7, 1, 0, 0},
		{time.Second, 0, 7, 2, 0, 0},
		// 4 in debt: 5 tokens to one whole, 5/3 s rounded up to the µs.
		{time.Second, 4, 7, 0, 0, 1_666_667 * time.Microsecond},
		{3 * time.Second, 0, 1, 1, 1, 0},
		{3 * time.Second, 0, tierlimit.MaxRate, 1, 0, 0},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		if s.settle > 0 {
			if _, err := b.Settle(now, l, 0, s.settle); err != nil {
				t.Fatal(err)
			}
		}
		g, res, err := b.DecideAtMost(now, l, s.n)
		if err != nil || g != s.granted || res.Allowed != (s.granted > 0) || res.Remaining != s.remaining || res.RetryAfter != s.retry {
			t.Errorf("step %d: DecideAtMost(t0+%v, %d) = %d, %+v, %v; want %d, Remaining %d, RetryAfter %v",
				i, s.at, s.n, g, res, err, s.granted, s.remaining, s.retry)
		}
	}
	for _, n := range []int64{0, -1, tierlimit.MaxRate + 1, math.MinInt64} {
		if _, _, err := b.DecideAtMost(t0, l, n); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("DecideAtMost(%d) = %v, want ErrInvalidCost", n, err)
		}
	}
	if _, _, err := b.DecideAtMost(t0, tierlimit.Limit{Rate: 1}, 1); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("DecideAtMost under a zero period = %v, want ErrInvalidLimit", err)
	}
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
// difference, capped at the capacity; more by the difference, into debt
// (the part of the next token kept), floored at minus the capacity, and
// the debt repaid by the refill. Remaining is never negative; ResetAfter
// counts the debt.
func TestSettle(t *testing.T) {
	l := tierlimit.PerSecond(10) // a token every 100 ms
	b := NewWith(l, 2, t0)
	steps := []struct {
		at            time.Duration
		charged, used int64
		tokens, units int64
		reset         time.Duration
		uncharged     int64
	}{
		{0, 5, 3, 4, 0, 600 * time.Millisecond, 0},
		{0, 3, 3, 4, 0, 600 * time.Millisecond, 0},
		{50 * time.Millisecond, 2, 5, 1, 50_000, 850 * time.Millisecond, 0},
		// 1.5 - 9: 7.5 in debt, 17.5 tokens from full (was: floored at 0).
		{50 * time.Millisecond, 0, 9, -8, 50_000, 1750 * time.Millisecond, 0},
		{50 * time.Millisecond, 10, 0, 2, 50_000, 750 * time.Millisecond, 0},
		{50 * time.Millisecond, 10, 0, 10, 0, 0, 0},
		{60 * time.Millisecond, 0, 4, 6, 0, 400 * time.Millisecond, 0},
		{60 * time.Millisecond, 0, 10, -4, 0, 1400 * time.Millisecond, 0},
		// -14 floors at -10, the capacity: 4 uncharged.
		{60 * time.Millisecond, 0, 10, -10, 0, 2 * time.Second, 4},
		{160 * time.Millisecond, 0, 0, -9, 0, 1900 * time.Millisecond, 0},
		{1160 * time.Millisecond, 3, 2, 2, 0, 800 * time.Millisecond, 0},
		// A use above the capacity: 13 - 1 = 12 is the room, 2 + 10: all charged.
		{1160 * time.Millisecond, 1, 13, -10, 0, 2 * time.Second, 0},
		// From a part-token above the floor: the part goes too, and the
		// whole room (-10 + 10 = 0) leaves all 1 000 000 uncharged.
		{1210 * time.Millisecond, 0, 1_000_000, -10, 0, 2 * time.Second, 1_000_000},
		// Far past what a level could ever hold.
		{1210 * time.Millisecond, 0, math.MaxInt64, -10, 0, 2 * time.Second, math.MaxInt64},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		res, err := b.Settle(now, l, s.charged, s.used)
		if err != nil {
			t.Fatal(err)
		}
		k, u := b.Level(now)
		if !res.Allowed || res.Remaining != max(0, s.tokens) || k != s.tokens || u != s.units || res.ResetAfter != s.reset || res.Uncharged != s.uncharged {
			t.Errorf("step %d: Settle(t0+%v, %d, %d) = %v, %d, reset %v, uncharged %d, level %d+%d units; want true, %d, reset %v, uncharged %d, level %d+%d",
				i, s.at, s.charged, s.used, res.Allowed, res.Remaining, res.ResetAfter, res.Uncharged, k, u, max(0, s.tokens), s.reset, s.uncharged, s.tokens, s.units)
		}
	}
	for _, c := range [][2]int64{{-1, 0}, {0, -1}, {11, 0}} {
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
