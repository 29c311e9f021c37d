package local

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestDebt: Settle takes a key below empty, down to minus its burst; the
// key is then denied, peeks included, with the exact wait until it holds
// the cost (the debt counted), until its rate has repaid the debt.
func TestDebt(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(10)) // a token every 100 ms
	ctx := context.Background()
	if r, _ := l.AllowN(ctx, "k", 8); !r.Allowed {
		t.Fatalf("AllowN(8) denied: %+v", r)
	}
	// 4 more used than charged: 2 - 4, 2 in debt.
	if r, err := l.Settle(ctx, "k", 6, 10); err != nil || !r.Allowed || r.Remaining != 0 || r.ResetAfter != 1200*time.Millisecond {
		t.Fatalf("Settle(6, 10) = %+v, %v; want allowed, Remaining 0, ResetAfter 1.2s", r, err)
	}
	runSteps(t, l, clock, "k", []step{
		{0, 1, false, 0, 300 * time.Millisecond},
		{0, 0, false, 0, 200 * time.Millisecond}, // a peek in debt: until the level is 0
		{0, 10, false, 0, 1200 * time.Millisecond},
		{150 * time.Millisecond, 0, false, 0, 50 * time.Millisecond},
		{50 * time.Millisecond, 0, true, 0, 0},
		{100 * time.Millisecond, 1, true, 0, 0},
	})
	// The floor: 20 more taken from 0 leave -10, a burst in debt.
	if r, err := l.Settle(ctx, "k", 0, 10); err != nil || r.ResetAfter != 2*time.Second {
		t.Fatalf("Settle(0, 10) = %+v, %v; want ResetAfter 2s", r, err)
	}
	if r, err := l.Settle(ctx, "k", 0, 10); err != nil || r.ResetAfter != 2*time.Second {
		t.Fatalf("Settle(0, 10) again = %+v, %v; want ResetAfter 2s (floored at -10)", r, err)
	}
	runSteps(t, l, clock, "k", []step{
		{0, 10, false, 0, 2 * time.Second},
		{2 * time.Second, 10, true, 0, 0},
	})
}

// TestAllowAtMost: between 1 and n, as many as the key holds, n above the
// burst too; 0 with the exact wait for one whole token when the key holds
// a part of one or is in debt.
func TestAllowAtMost(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(3).WithBurst(5))
	ctx := context.Background()
	steps := []struct {
		advance   time.Duration
		settle    int64 // taken by a Settle first
		n         int64
		granted   int64
		remaining int64
		retry     time.Duration
	}{
		{0, 0, 2, 2, 3, 0},
		{0, 0, 100, 3, 0, 0},
		{0, 0, 1, 0, 0, 333_334 * time.Microsecond},
		// 1/3 s later, to the µs: 0.999999 of a token, none whole.
		{333_333 * time.Microsecond, 0, 7, 0, 0, time.Microsecond},
		{time.Microsecond, 0, 7, 1, 0, 0},
		{0, 2, 7, 0, 0, 1_000_000 * time.Microsecond}, // 2 in debt: 3 tokens to one whole
		{time.Second, 0, tierlimit.MaxRate, 1, 0, 0},
	}
	for i, s := range steps {
		clock.Add(s.advance)
		if s.settle > 0 {
			if _, err := l.Settle(ctx, "k", 0, s.settle); err != nil {
				t.Fatal(err)
			}
		}
		g, r, err := l.AllowAtMost(ctx, "k", s.n)
		if err != nil || g != s.granted || r.Allowed != (g > 0) || r.Remaining != s.remaining || r.RetryAfter != s.retry {
			t.Errorf("step %d: AllowAtMost(%d) = %d, %+v, %v; want %d, Remaining %d, RetryAfter %v",
				i, s.n, g, r, err, s.granted, s.remaining, s.retry)
		}
	}
}

// TestAllowAtMostInput: bad input is refused in local's one error form,
// before anything is taken; a blocked key is granted 0 with the blocked
// Result; after Close, ErrClosed.
func TestAllowAtMostInput(t *testing.T) {
	p := newPlans("blocked", tierlimit.Blocked, "bad", tierlimit.Limit{Rate: 1})
	l, _ := newTest(t, tierlimit.PerSecond(10), WithLimitFunc(p.limit))
	ctx := context.Background()
	for _, c := range []struct {
		key  string
		n    int64
		want error
		msg  string
	}{
		{"a", 0, tierlimit.ErrInvalidCost, `local: tierlimit: invalid cost: n 0 must be between 1 and 1000000000000000 (key "a")`},
		{"a", -1, tierlimit.ErrInvalidCost, `local: tierlimit: invalid cost: n -1 must be between 1 and 1000000000000000 (key "a")`},
		{"a", math.MinInt64, tierlimit.ErrInvalidCost, "local: tierlimit: invalid cost: "},
		{"a", tierlimit.MaxRate + 1, tierlimit.ErrInvalidCost, "local: tierlimit: invalid cost: n 1000000000000001 "},
		{"", 1, tierlimit.ErrInvalidKey, "local: tierlimit: invalid key: empty"},
		{strings.Repeat("k", tierlimit.MaxKeyLen+1), 1, tierlimit.ErrInvalidKey, "local: tierlimit: invalid key: "},
		{"bad", 1, tierlimit.ErrInvalidLimit, "local: tierlimit: invalid limit: "},
	} {
		g, r, err := l.AllowAtMost(ctx, c.key, c.n)
		if !errors.Is(err, c.want) || err == nil || !strings.HasPrefix(err.Error(), c.msg) || g != 0 || r != (tierlimit.Result{}) {
			t.Errorf("AllowAtMost(%.10q, %d) = %d, %+v, %v; want 0, %v beginning %q", c.key, c.n, g, r, err, c.want, c.msg)
		}
	}
	if r, _ := l.AllowN(ctx, "a", 0); r.Remaining != 10 {
		t.Errorf("after refused calls: Remaining %d, want 10", r.Remaining)
	}
	if g, r, err := l.AllowAtMost(ctx, "blocked", 5); err != nil || g != 0 || r != tenanttest.BlockedResult {
		t.Errorf("AllowAtMost(blocked, 5) = %d, %+v, %v; want 0, the blocked Result", g, r, err)
	}
	l.Close()
	if _, _, err := l.AllowAtMost(ctx, "a", 1); err != tierlimit.ErrClosed {
		t.Errorf("AllowAtMost after Close = %v, want ErrClosed", err)
	}
}

// TestAllowAtMostObserved: the observer sees N = granted, or n when denied.
func TestAllowAtMostObserved(t *testing.T) {
	var got []tierlimit.Decision
	o := &tierlimit.Observer{Decision: func(d tierlimit.Decision) { got = append(got, d) }}
	l, _ := newTest(t, tierlimit.PerSecond(10), WithObserver(o))
	ctx := context.Background()
	l.AllowAtMost(ctx, "k", 4)
	l.AllowAtMost(ctx, "k", 100)
	l.AllowAtMost(ctx, "k", 7)
	want := []struct {
		allowed bool
		n       int64
	}{{true, 4}, {true, 6}, {false, 7}}
	if len(got) != len(want) {
		t.Fatalf("%d decisions reported, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].Allowed != w.allowed || got[i].N != w.n || got[i].Source != tierlimit.SourceLocal {
			t.Errorf("decision %d = %+v, want allowed %v, N %d", i, got[i], w.allowed, w.n)
		}
	}
}

// TestOverrunBound: a tenant whose every request uses 50% more than its
// estimate uses, over every interval, at most one bucket plus one
// request's overrun (tenanttest.CheckOverrun), on the injected clock.
func TestOverrunBound(t *testing.T) {
	for _, c := range []struct {
		limit tierlimit.Limit
		est   int64
	}{
		{tierlimit.PerSecond(100), 10},
		{tierlimit.PerSecond(3).WithBurst(7), 4},
		{tierlimit.PerMinute(1_000_003), 200_000},
	} {
		l, clock := newTest(t, c.limit)
		step := 2 * c.limit.RefillTime(c.est)
		n := tenanttest.CheckOverrun(t, l, "k", c.limit, c.est, clock.Now(), step, 2000, clock.Set)
		t.Logf("%v, estimate %d: %d of 2000 admitted", c.limit, c.est, n)
	}
}

// TestAllowAtMostConcurrent: many goroutines on one key get one bucket in
// all.
func TestAllowAtMostConcurrent(t *testing.T) {
	l, _ := newTest(t, tierlimit.PerSecond(5000))
	tenanttest.CheckAtMostConcurrent(t, l, "k", 5000, 32)
}

// TestWaitNInDebt: WaitN on a key in debt waits until the level holds its
// cost, the debt repaid first, on the system clock; a deadline it cannot
// meet fails at once.
func TestWaitNInDebt(t *testing.T) {
	l, err := New(tierlimit.PerSecond(10)) // a token every 100 ms
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Settle(context.Background(), "k", 0, 10); err != nil { // 10 - 10: empty
		t.Fatal(err)
	}
	if _, err := l.Settle(context.Background(), "k", 0, 2); err != nil { // 2 in debt
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.WaitN(short, "k", 1); !errors.Is(err, tierlimit.ErrWaitDeadline) || time.Since(start) >= 150*time.Millisecond {
		t.Errorf("WaitN(1) with 150 ms for a 300 ms wait = %v after %v, want ErrWaitDeadline before the deadline", err, time.Since(start))
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	start = time.Now()
	r, err := l.WaitN(ctx, "k", 1)
	if took := time.Since(start); err != nil || !r.Allowed || took < 250*time.Millisecond {
		t.Errorf("WaitN(1) 2 in debt = %+v, %v after %v; want admitted after about 300 ms", r, err, took)
	}
}

// TestDebtAcrossALimitChange: a key in debt whose LimitFunc answer changes
// keeps its debt, refilled at the new rate, down to minus the new burst.
func TestDebtAcrossALimitChange(t *testing.T) {
	p := newPlans()
	l, _ := newTest(t, tierlimit.PerSecond(10), WithLimitFunc(p.limit))
	ctx := context.Background()
	if _, err := l.Settle(ctx, "k", 0, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Settle(ctx, "k", 0, 4); err != nil { // 4 in debt
		t.Fatal(err)
	}
	for i, s := range []struct {
		limit tierlimit.Limit
		retry time.Duration
	}{
		{tierlimit.PerSecond(10), 400 * time.Millisecond},
		{tierlimit.PerSecond(20), 200 * time.Millisecond},              // 4 at 20/s
		{tierlimit.PerSecond(20).WithBurst(3), 150 * time.Millisecond}, // floored at -3
	} {
		p.set("k", s.limit)
		r, err := l.AllowN(ctx, "k", 0)
		if err != nil || r.Allowed || r.RetryAfter != s.retry || r.Limit != s.limit {
			t.Errorf("step %d: a peek under %v = %+v, %v; want denied, RetryAfter %v", i, s.limit, r, err, s.retry)
		}
	}
}
