package remote

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// budget is what every limiter of the package offers for overruns
// (Settle into debt) and batches (AllowAtMost).
type budget interface {
	tenant
	AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error)
}

func newBudget(t *testing.T, alg constructor, rdb redis.UniversalClient, l tierlimit.Limit, opts ...Option) budget {
	t.Helper()
	return newTenant(t, alg, rdb, l, opts...).(budget)
}

// buckets are the algorithms that keep debt.
func isBucket(alg string) bool { return alg == "TokenBucket" || alg == "GCRA" }

// TestBudgetModel drives TokenBucket and GCRA on miniredis with random
// AllowN, Settle (into debt and out) and AllowAtMost calls and clock steps,
// for limits small and large, and checks every answer against the exact
// one-bucket model, xrate.Bucket (itself checked against big.Int
// arithmetic): the same decision, grant, Remaining, RetryAfter and
// ResetAfter, to the µs.
func TestBudgetModel(t *testing.T) {
	limits := []tierlimit.Limit{
		tierlimit.PerSecond(3).WithBurst(5),
		tierlimit.PerSecond(10),
		{Rate: 7, Period: 50 * time.Microsecond},
		{Rate: 26, Period: time.Microsecond},
		tierlimit.PerDay(1_000_003),
		tierlimit.PerSecond(10_000_000_000).WithBurst(3_000_000_007),
	}
	for _, alg := range algorithms[:2] {
		for li, limit := range limits {
			t.Run(fmt.Sprintf("%s/%v", alg.name, limit), func(t *testing.T) {
				m, rdb := redistest.Mini(t)
				l := newBudget(t, alg.new, rdb, limit)
				rng := rand.New(rand.NewPCG(uint64(li), 30))
				now := t0
				m.SetTime(now)
				model := xrate.New(limit, now)
				c := limit.Capacity()
				fill := limit.RefillTime(c) / time.Microsecond
				for step := range 1500 {
					dt := time.Duration(rng.Int64N(int64(fill)/4+2)) * time.Microsecond
					if rng.IntN(8) == 0 {
						dt = 0
					}
					now = now.Add(dt)
					m.SetTime(now)
					m.FastForward(dt)
					cost := func() int64 {
						if rng.IntN(2) == 0 {
							return rng.Int64N(min(c, 4) + 1)
						}
						return rng.Int64N(c + 1)
					}
					op := rng.IntN(3)
					a, b := cost(), cost()
					if op == 2 {
						a = 1 + rng.Int64N(2*c)
					}
					budgetStep(t, l, model, now, limit, op, a, b, fmt.Sprintf("step %d at +%v", step, now.Sub(t0)))
				}
			})
		}
	}
}

// onBoth runs run on miniredis and on a real Redis with a client clock.
func onBoth(t *testing.T, run func(*testing.T, backend)) {
	t.Run("miniredis", func(t *testing.T) { run(t, miniBackend(t)) })
	t.Run("redis", func(t *testing.T) { run(t, clientClockBackend(redistest.Start(t).Client(t))) })
}

// TestDebt settles a TokenBucket and a GCRA key below empty: it is denied,
// peeks included, with the exact wait until it holds the cost (the debt
// counted), until the rate has repaid the debt; the debt floors at minus
// the capacity; Remaining is never negative and ResetAfter counts the debt.
func TestDebt(t *testing.T) {
	onBoth(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
		for _, alg := range algorithms[:2] {
			t.Run(alg.name, func(t *testing.T) {
				l := newBudget(t, alg.new, b.rdb, tierlimit.PerSecond(10), b.opts...) // a token every 100 ms
				key := "debt:" + alg.name
				type step struct {
					at        time.Duration
					settle    [2]int64 // charged, used; or
					n         int64    // AllowN's cost
					allowed   bool
					remaining int64
					retry     time.Duration
					reset     time.Duration
				}
				settle := func(at time.Duration, charged, used int64, reset time.Duration) step {
					return step{at: at, settle: [2]int64{charged, used}, n: -1, allowed: true, reset: reset}
				}
				steps := []step{
					{at: 0, n: 8, allowed: true, remaining: 2, reset: ms(800)},
					settle(0, 6, 10, ms(1200)), // 2 - 4: 2 in debt
					{at: 0, n: 1, retry: ms(300), reset: ms(1200)},
					{at: 0, n: 0, retry: ms(200), reset: ms(1200)}, // a peek: until the level is 0
					{at: 0, n: 10, retry: ms(1200), reset: ms(1200)},
					{at: ms(150), n: 0, retry: ms(50), reset: ms(1050)},
					{at: ms(200), n: 0, allowed: true, reset: ms(1000)},
					{at: ms(300), n: 1, allowed: true, reset: ms(1000)},
					settle(ms(300), 0, 10, ms(2000)),
					settle(ms(300), 0, 10, ms(2000)), // -20 floors at -10
					{at: ms(300), n: 10, retry: ms(2000), reset: ms(2000)},
					{at: ms(2299), n: 10, remaining: 9, retry: ms(1), reset: ms(1)},
					{at: ms(2300), n: 10, allowed: true, reset: ms(1000)},
				}
				for i, s := range steps {
					b.set(t0.Add(s.at))
					var r tierlimit.Result
					var err error
					if s.n < 0 {
						r, err = l.Settle(ctx, key, s.settle[0], s.settle[1])
					} else {
						r, err = l.AllowN(ctx, key, s.n)
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry || r.ResetAfter != s.reset {
						t.Errorf("step %d at %v: %v, Remaining %d, RetryAfter %v, ResetAfter %v; want %v, %d, %v, %v",
							i, s.at, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
					}
				}
				// AllowAll denies a take whose key is in debt below its N, and
				// charges the other key nothing.
				if _, err := l.Settle(ctx, key, 0, 5); err != nil { // 0 - 5
					t.Fatal(err)
				}
				other := "other:" + alg.name
				r, err := l.AllowAll(ctx, tierlimit.Take{Key: other, N: 1}, tierlimit.Take{Key: key, N: 0})
				if err != nil || r.Allowed || r.RetryAfter != ms(500) {
					t.Errorf("AllowAll(other 1, 5 in debt 0) = %+v, %v; want denied, RetryAfter 500ms", r, err)
				}
				if r, _ := l.AllowN(ctx, other, 0); r.Remaining != 10 {
					t.Errorf("after a refused AllowAll, the other key has %d, want 10", r.Remaining)
				}
			})
		}
	})
}

// TestWindowsKeepNoDebt: a window's Settle takes at most what the window
// still admits, so an overrun is forgiven, as their docs say.
func TestWindowsKeepNoDebt(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	ctx := context.Background()
	for _, alg := range algorithms[2:] {
		l := newBudget(t, alg.new, b.rdb, tierlimit.PerSecond(10))
		l.AllowN(ctx, "k", 8)
		r, err := l.Settle(ctx, "k", 0, 10)
		if err != nil || r.Remaining != 0 {
			t.Errorf("%s: Settle(0, 10) at 2 left = %+v, %v; want Remaining 0", alg.name, r, err)
		}
		if r, _ := l.AllowN(ctx, "k", 0); !r.Allowed {
			t.Errorf("%s: a peek after an overrun = %+v, want allowed (no debt)", alg.name, r)
		}
	}
}

// TestAllowAtMost steps every algorithm through AllowAtMost: between 1 and
// n, as many as the key holds, n above the capacity too; none when it
// holds less than one whole token (a part of one, debt, a full window),
// with the same denial as AllowN(1) at that moment: for a bucket, the
// exact wait for one token.
func TestAllowAtMost(t *testing.T) {
	onBoth(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				limit := tierlimit.PerSecond(3).WithBurst(5)
				if alg.windowed {
					limit = tierlimit.PerSecond(5)
				}
				l := newBudget(t, alg.new, b.rdb, limit, b.opts...)
				key := "atmost:" + alg.name
				type step struct {
					at        time.Duration
					settle    int64 // taken by a Settle first
					n         int64
					granted   int64
					remaining int64
					retry     time.Duration // -1: a window's, checked against AllowN(1)
				}
				steps := []step{
					{0, 0, 2, 2, 3, 0},
					{0, 0, 100, 3, 0, 0},
					{0, 0, 1, 0, 0, 333_334 * time.Microsecond},
					// 1/3 s later, to the µs: 0.999999 of a token, none whole.
					{333_333 * time.Microsecond, 0, 7, 0, 0, time.Microsecond},
					{333_334 * time.Microsecond, 0, 7, 1, 0, 0},
					{333_334 * time.Microsecond, 2, 7, 0, 0, time.Second}, // 2 in debt: 3 to one whole
					{1_333_334 * time.Microsecond, 0, tierlimit.MaxRate, 1, 0, 0},
				}
				if alg.windowed {
					steps = []step{
						{0, 0, 2, 2, 3, 0},
						{0, 0, 100, 3, 0, 0},
						{0, 0, 1, 0, 0, -1},
						{500 * time.Millisecond, 0, 1, 0, 0, -1},
					}
				}
				for i, s := range steps {
					b.set(t0.Add(s.at))
					if s.settle > 0 {
						if _, err := l.Settle(ctx, key, 0, s.settle); err != nil {
							t.Fatal(err)
						}
					}
					g, r, err := l.AllowAtMost(ctx, key, s.n)
					if err != nil || g != s.granted || r.Allowed != (g > 0) || r.Remaining != s.remaining ||
						s.retry >= 0 && r.RetryAfter != s.retry || r.Limit != limit || r.Source != tierlimit.SourceRemote {
						t.Errorf("step %d: AllowAtMost(%d) at %v = %d, %+v, %v; want %d, Remaining %d, RetryAfter %v",
							i, s.n, s.at, g, r, err, s.granted, s.remaining, s.retry)
					}
					if g == 0 {
						if one, _ := l.AllowN(ctx, key, 1); one != r {
							t.Errorf("step %d: AllowAtMost's denial %+v, AllowN(1)'s %+v; want the same", i, r, one)
						}
					}
				}
			})
		}
	})
}

// TestAllowAtMostWithLimits: a key of several limits is granted the least
// any of them holds, charged to every one, in one script call; when one
// holds none, nothing is charged and RetryAfter is the largest.
func TestAllowAtMostWithLimits(t *testing.T) {
	onBoth(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.set(t0)
		hook := &callcount.Hook{}
		rdb := b.rdb
		rdb.AddHook(hook)
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				def, extra := tierlimit.PerSecond(10), tierlimit.PerMinute(100).WithBurst(4)
				if alg.windowed {
					extra = tierlimit.Limit{Rate: 4, Period: time.Minute}
				}
				l := newBudget(t, alg.new, rdb, def, append([]Option{WithLimits(extra)}, b.opts...)...)
				key := "limits:" + alg.name
				if err := l.engine().Load(ctx); err != nil {
					t.Fatal(err)
				}
				before := hook.Calls()
				g, r, err := l.AllowAtMost(ctx, key, 7)
				if err != nil || g != 4 || !r.Allowed || r.Remaining != 0 || r.Limit != extra {
					t.Errorf("AllowAtMost(7) = %d, %+v, %v; want 4, Remaining 0 under %v", g, r, err, extra)
				}
				if calls := hook.Calls() - before; calls != 1 {
					t.Errorf("AllowAtMost made %d script calls, want 1", calls)
				}
				g, r, err = l.AllowAtMost(ctx, key, 1)
				if err != nil || g != 0 || r.Allowed || r.Limit != extra || r.RetryAfter <= 0 {
					t.Errorf("AllowAtMost(1) on the drained limit = %d, %+v, %v; want 0, denied by %v", g, r, err, extra)
				}
				if isBucket(alg.name) && r.RetryAfter != 600*time.Millisecond {
					t.Errorf("AllowAtMost(1) RetryAfter = %v, want 600ms (a token of 100/min)", r.RetryAfter)
				}
				// The default limit was charged 4, once: 6 left.
				if got := usedIn(t, alg.name, rdb, l.engine().Keys(key), def, t0.UnixMicro()); got != 4 {
					t.Errorf("the default limit holds %d used, want 4", got)
				}
			})
		}
	})
}

// TestAllowAtMostInput: bad input is refused before any call, in remote's
// one error form; a key the LimitFunc blocks is granted 0 with the
// blocked Result, without a call.
func TestAllowAtMostInput(t *testing.T) {
	m, rdb := redistest.Mini(t)
	m.SetTime(t0)
	ctx := context.Background()
	plans := func(key string) tierlimit.Limit {
		switch key {
		case "blocked":
			return tierlimit.Blocked
		case "bad":
			return tierlimit.Limit{Rate: 1}
		}
		return tierlimit.Limit{}
	}
	long := strings.Repeat("k", tierlimit.MaxKeyLen+1)
	for _, alg := range algorithms {
		l := newBudget(t, alg.new, rdb, tierlimit.PerSecond(10), WithLimitFunc(plans))
		for _, c := range []struct {
			key  string
			n    int64
			want error
			msg  string
		}{
			{"a", 0, tierlimit.ErrInvalidCost, `remote: tierlimit: invalid cost: n 0 must be between 1 and 1000000000000000 (key "a")`},
			{"a", -1, tierlimit.ErrInvalidCost, `remote: tierlimit: invalid cost: n -1 must be between 1 and 1000000000000000 (key "a")`},
			{"a", math.MinInt64, tierlimit.ErrInvalidCost, "remote: tierlimit: invalid cost: "},
			{"a", tierlimit.MaxRate + 1, tierlimit.ErrInvalidCost, `remote: tierlimit: invalid cost: n 1000000000000001 must be between 1 and 1000000000000000 (key "a")`},
			{"", 1, tierlimit.ErrInvalidKey, "remote: tierlimit: invalid key: empty"},
			{long, 1, tierlimit.ErrInvalidKey, "remote: tierlimit: invalid key: 1025 bytes"},
			{"bad", 1, tierlimit.ErrInvalidLimit, "remote: tierlimit: invalid limit: "},
		} {
			g, r, err := l.AllowAtMost(ctx, c.key, c.n)
			if !errors.Is(err, c.want) || err == nil || !strings.HasPrefix(err.Error(), c.msg) || g != 0 || r != (tierlimit.Result{}) {
				t.Errorf("%s: AllowAtMost(%.10q, %d) = %d, %+v, %v; want 0, %v beginning %q", alg.name, c.key, c.n, g, r, err, c.want, c.msg)
			}
		}
		if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
			t.Errorf("%s: refused calls left %d keys in Redis, want 0", alg.name, n)
		}
		if g, r, err := l.AllowAtMost(ctx, "blocked", 5); err != nil || g != 0 || r != tenanttest.BlockedResult {
			t.Errorf("%s: AllowAtMost(blocked, 5) = %d, %+v, %v; want 0, the blocked Result", alg.name, g, r, err)
		}
		if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
			t.Errorf("%s: a blocked key's AllowAtMost left %d keys in Redis, want 0", alg.name, n)
		}
	}
}

// TestAllowAtMostObserved: the observer sees one "allow" call per
// AllowAtMost, and a Decision of N = granted, or n when denied.
func TestAllowAtMostObserved(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	ctx := context.Background()
	for _, alg := range algorithms {
		var rec recorder
		l := newBudget(t, alg.new, b.rdb, tierlimit.PerSecond(10), WithObserver(rec.observer()))
		key := "observed:" + alg.name
		l.AllowAtMost(ctx, key, 4)
		l.AllowAtMost(ctx, key, 100)
		l.AllowAtMost(ctx, key, 7)
		want := []tierlimit.Decision{
			{Allowed: true, N: 4}, {Allowed: true, N: 6}, {Allowed: false, N: 7},
		}
		if len(rec.decisions) != len(want) {
			t.Fatalf("%s: %d decisions, want %d", alg.name, len(rec.decisions), len(want))
		}
		for i, w := range want {
			if d := rec.decisions[i]; d.Allowed != w.Allowed || d.N != w.N || d.Source != tierlimit.SourceRemote {
				t.Errorf("%s: decision %d = %+v, want allowed %v, N %d", alg.name, i, d, w.Allowed, w.N)
			}
		}
		if ops := rec.ops(); len(ops) != 3 || ops[0] != "allow" || ops[2] != "allow" {
			t.Errorf("%s: calls %v, want allow thrice", alg.name, ops)
		}
	}
}

// TestOverrunBound: a tenant overrunning every estimate by 50% uses, over
// every interval, at most one bucket plus one request's overrun
// (tenanttest.CheckOverrun), on TokenBucket and GCRA, on miniredis's clock
// and on a real Redis with a client clock.
func TestOverrunBound(t *testing.T) {
	onBoth(t, func(t *testing.T, b backend) {
		for _, alg := range algorithms[:2] {
			for _, c := range []struct {
				limit tierlimit.Limit
				est   int64
			}{
				{tierlimit.PerSecond(100), 10},
				{tierlimit.PerSecond(3).WithBurst(7), 4},
				{tierlimit.PerMinute(1_000_003), 200_000},
			} {
				l := newBudget(t, alg.new, b.rdb, c.limit, b.opts...)
				key := fmt.Sprintf("overrun:%s:%v", alg.name, c.limit)
				steps := 1000
				n := tenanttest.CheckOverrun(t, l, key, c.limit, c.est, t0, 2*c.limit.RefillTime(c.est), steps, b.set)
				t.Logf("%s %v, estimate %d: %d of %d admitted", alg.name, c.limit, c.est, n, steps)
			}
		}
	})
}

// TestAllowAtMostConcurrent: 32 goroutines on 4 clients call AllowAtMost on
// one key of a real Redis, on a client clock that does not move: every
// algorithm grants one bucket (or window) in all, never more. The limit is
// per day so that the keys' TTLs, which Redis counts in real time, outlast
// the test: a key granted 10 of 5000/s lives 2 ms, and when it expired
// the frozen clock read a full bucket (5010 granted, which a moving clock
// would have refilled too; CI at 57a4c46 saw 5044).
func TestAllowAtMostConcurrent(t *testing.T) {
	s := redistest.Start(t)
	clock := clocktest.New(t0)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			limit := tierlimit.PerDay(5000)
			var ls []tenanttest.Budget
			for range 4 {
				rdb := s.Client(t)
				ls = append(ls, newBudget(t, alg.new, rdb, limit, WithClientClock(clock)))
			}
			tenanttest.CheckAtMostConcurrent(t, spread(ls), "hot", 5000, 32)
		})
	}
}

// spread is a tenanttest.Budget whose calls go round its limiters (one
// client each).
func spread(ls []tenanttest.Budget) tenanttest.Budget {
	return &roundRobin{ls: ls}
}

type roundRobin struct {
	ls []tenanttest.Budget
	i  atomic.Int64
}

func (r *roundRobin) next() tenanttest.Budget { return r.ls[int(r.i.Add(1))%len(r.ls)] }

func (r *roundRobin) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	return r.next().AllowN(ctx, key, n)
}

func (r *roundRobin) Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	return r.next().Settle(ctx, key, charged, used)
}

func (r *roundRobin) AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	return r.next().AllowAtMost(ctx, key, n)
}

// TestWaitNInDebt: on a real Redis and its clock, WaitN on a TokenBucket
// or GCRA key in debt waits until the level holds its cost, the debt
// repaid first; a deadline it cannot meet fails at once.
func TestWaitNInDebt(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	for _, alg := range algorithms[:2] {
		t.Run(alg.name, func(t *testing.T) {
			l := newBudget(t, alg.new, rdb, tierlimit.PerSecond(10)) // a token every 100 ms
			ctx := context.Background()
			if _, err := l.Settle(ctx, "k", 0, 10); err != nil { // 10 - 10: empty
				t.Fatal(err)
			}
			if _, err := l.Settle(ctx, "k", 0, 2); err != nil { // 2 in debt
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			defer cancel()
			start := time.Now()
			if _, err := l.WaitN(short, "k", 1); !errors.Is(err, tierlimit.ErrWaitDeadline) || time.Since(start) >= 150*time.Millisecond {
				t.Errorf("WaitN(1) with 150 ms for a 300 ms wait = %v after %v, want ErrWaitDeadline before the deadline", err, time.Since(start))
			}
			long, cancel2 := context.WithTimeout(ctx, 2*time.Second)
			defer cancel2()
			start = time.Now()
			r, err := l.WaitN(long, "k", 1)
			if took := time.Since(start); err != nil || !r.Allowed || took < 200*time.Millisecond {
				t.Errorf("WaitN(1) 2 in debt = %+v, %v after %v; want admitted after about 300 ms", r, err, took)
			}
		})
	}
}

// TestAllowAtMostTwin drives two keys of every algorithm, under two limits
// (WithLimits), through the same random history (AllowN, Settle, clock
// steps) on miniredis, and compares AllowAtMost(n) on one with AllowN on
// the other: a grant of g is what AllowN(g) does (with the same Result),
// and AllowN(g+1) would have been denied when g < n; a grant of 0 is
// AllowN(1)'s denial.
func TestAllowAtMostTwin(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			def, extra := tierlimit.PerSecond(7), tierlimit.Limit{Rate: 20, Period: 5 * time.Second}
			if !alg.windowed {
				extra = extra.WithBurst(9)
			}
			l := newBudget(t, alg.new, rdb, def, WithLimits(extra))
			rng := rand.New(rand.NewPCG(3, 4))
			now := t0
			var full, part, none int
			defer func() { t.Logf("AllowAtMost granted all %d times, part %d, none %d", full, part, none) }()
			for step := range 600 {
				dt := time.Duration(rng.Int64N(400_000)) * time.Microsecond
				now = now.Add(dt)
				m.SetTime(now)
				m.FastForward(dt)
				switch rng.IntN(4) {
				case 0: // the same history on both
					n := rng.Int64N(4)
					a, _ := l.AllowN(ctx, "a", n)
					b, _ := l.AllowN(ctx, "b", n)
					if a != b {
						t.Fatalf("step %d: AllowN(%d) differs on the twins: %+v, %+v", step, n, a, b)
					}
				case 1:
					c, u := rng.Int64N(5), rng.Int64N(5)
					l.Settle(ctx, "a", c, u)
					l.Settle(ctx, "b", c, u)
				default:
					n := 1 + rng.Int64N(12)
					g, r, err := l.AllowAtMost(ctx, "a", n)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case g == n:
						full++
					case g > 0:
						part++
					default:
						none++
					}
					if g > 0 && g < n && g < 7 {
						if more, _ := l.AllowN(ctx, "b", g+1); more.Allowed {
							t.Fatalf("step %d: AllowAtMost(%d) granted %d, but AllowN(%d) is allowed", step, n, g, g+1)
						}
					}
					want, _ := l.AllowN(ctx, "b", max(g, 1))
					if r != want || r.Allowed != (g > 0) {
						t.Fatalf("step %d: AllowAtMost(%d) = %d, %+v; AllowN(%d) = %+v", step, n, g, r, max(g, 1), want)
					}
				}
			}
		})
	}
}

// TestDebtAcrossALimitChange: a key in debt whose LimitFunc answer changes
// keeps its debt (in whole tokens, rounded up, on GCRA), refilled at the
// new rate, down to minus the new capacity.
func TestDebtAcrossALimitChange(t *testing.T) {
	onBoth(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, alg := range algorithms[:2] {
			t.Run(alg.name, func(t *testing.T) {
				var cur tierlimit.Limit
				l := newBudget(t, alg.new, b.rdb, tierlimit.PerSecond(10),
					append([]Option{WithLimitFunc(func(string) tierlimit.Limit { return cur })}, b.opts...)...)
				b.set(t0)
				key := "change:" + alg.name
				if _, err := l.Settle(ctx, key, 0, 10); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Settle(ctx, key, 0, 4); err != nil { // 4 in debt
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
					cur = s.limit
					r, err := l.AllowN(ctx, key, 0)
					if err != nil || r.Allowed || r.RetryAfter != s.retry || r.Limit != s.limit {
						t.Errorf("step %d: a peek under %v = %+v, %v; want denied, RetryAfter %v", i, s.limit, r, err, s.retry)
					}
				}
			})
		}
	})
}

// TestBudgetModelLimitChanges is TestBudgetModel for a TokenBucket key
// whose LimitFunc answer changes at random: the script's conversion (the
// level refilled under the old limit, its whole tokens or debt kept within
// the new capacity, the part of a token scaled down) must be xrate's
// follow, exactly. One convention differs, and the model follows Redis
// there: an absent key (last written full, or expired) is a full bucket
// of the limit it is next decided under, where xrate keeps a full
// bucket's tokens, capped.
func TestBudgetModelLimitChanges(t *testing.T) {
	limits := []tierlimit.Limit{
		tierlimit.PerSecond(3).WithBurst(5),
		tierlimit.PerSecond(10),
		tierlimit.PerSecond(7).WithBurst(2),
		{Rate: 40, Period: 3 * time.Second},
	}
	m, rdb := redistest.Mini(t)
	cur := limits[0]
	l := newBudget(t, ctor(NewTokenBucket), rdb, tierlimit.PerSecond(1000),
		WithLimitFunc(func(string) tierlimit.Limit { return cur }))
	rng := rand.New(rand.NewPCG(11, 12))
	now := t0
	m.SetTime(now)
	model := xrate.New(cur, now)
	key := l.engine().Keys("k")[0]
	for step := range 3000 {
		dt := time.Duration(rng.Int64N(300_000)) * time.Microsecond
		now = now.Add(dt)
		m.SetTime(now)
		m.FastForward(dt)
		if rng.IntN(10) == 0 {
			if cur = limits[rng.IntN(len(limits))]; !m.Exists(key) {
				model = xrate.New(cur, now)
			}
		}
		c := cur.Capacity()
		op := rng.IntN(3)
		a, b := rng.Int64N(c+1), rng.Int64N(c+1)
		if op == 2 {
			a = 1 + rng.Int64N(2*c)
		}
		budgetStep(t, l, model, now, cur, op, a, b, fmt.Sprintf("step %d at +%v under %v", step, now.Sub(t0), cur))
	}
}

// budgetStep makes op on l's key "k" at now (0: AllowN(a); 1: Settle(a, b);
// 2: AllowAtMost(a)), and the same on model under lim, and fails t, naming
// the step by where, unless both answer alike to the µs.
func budgetStep(t *testing.T, l budget, model *xrate.Bucket, now time.Time, lim tierlimit.Limit, op int, a, b int64, where string) {
	t.Helper()
	ctx := context.Background()
	var got, want tierlimit.Result
	var granted, wantGranted int64
	var err error
	switch op {
	case 0:
		got, err = l.AllowN(ctx, "k", a)
		want, _ = model.DecideLimit(now, lim, a)
	case 1:
		got, err = l.Settle(ctx, "k", a, b)
		want, _ = model.Settle(now, lim, a, b)
	case 2:
		granted, got, err = l.AllowAtMost(ctx, "k", a)
		wantGranted, want, _ = model.DecideAtMost(now, lim, a)
	}
	if err != nil {
		t.Fatalf("%s, op %d: %v", where, op, err)
	}
	want.Source = tierlimit.SourceRemote
	if got != want || granted != wantGranted {
		k, u := model.Level(now)
		t.Fatalf("%s, op %d: got %d, %+v; model (level %d + %d units) %d, %+v", where, op, granted, got, k, u, wantGranted, want)
	}
}

// TestGCRASettleClockBehind: a Settle whose clock is behind the last
// write's, on a GCRA key in its deepest debt, never moves the TAT back
// (which would give tokens): the debt stays.
func TestGCRASettleClockBehind(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	l := newBudget(t, ctor(NewGCRA), b.rdb, tierlimit.PerSecond(10))
	b.set(t0.Add(time.Second))
	l.AllowN(ctx, "k", 10)
	l.Settle(ctx, "k", 0, 10) // TAT at t0+3s: 10 in debt at t0+1s
	b.set(t0)
	if _, err := l.Settle(ctx, "k", 0, 5); err != nil {
		t.Fatal(err)
	}
	b.set(t0.Add(time.Second))
	if r, _ := l.AllowN(ctx, "k", 0); r.Allowed || r.RetryAfter != time.Second {
		t.Errorf("a peek after a Settle from a clock 1 s behind = %+v, want denied, RetryAfter 1s (the debt kept)", r)
	}
}

// TestAllowAtMostExact: 16 goroutines on 2 clients call AllowAtMost of 1
// to 8 on one key for about a second, on a real Redis's clock: what they
// are granted in all stays within each algorithm's bound over the run
// (exactBound, TestConcurrencyExact's), and a saturated key is granted
// most of it.
func TestAllowAtMostExact(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for ~6 s")
	}
	s := redistest.Start(t)
	limit := tierlimit.PerSecond(200)
	rdbs := []*redis.Client{s.Client(t), s.Client(t)}
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			var ls []budget
			for _, rdb := range rdbs {
				ls = append(ls, newBudget(t, alg.new, rdb, limit))
				ls[len(ls)-1].Allow(context.Background(), "warm-up")
			}
			var granted atomic.Int64
			var wg sync.WaitGroup
			start, boundary := alignToServerSecond(t, rdbs[0])
			deadline := start.Add(900 * time.Millisecond)
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := ls[g%len(ls)]
					for n := int64(1 + g%8); time.Now().Before(deadline); {
						got, _, err := l.AllowAtMost(context.Background(), "hot", n)
						if err != nil {
							t.Error(err)
							return
						}
						granted.Add(got)
					}
				}()
			}
			wg.Wait()
			end, err := rdbs[0].Time(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			bound := exactBound(alg.name, limit, end.Sub(boundary))
			floor := exactBound(alg.name, limit, deadline.Sub(start))
			got := granted.Load()
			t.Logf("%s: granted %d; bound %d over %v", alg.name, got, bound, end.Sub(boundary).Round(time.Millisecond))
			if got > bound {
				t.Errorf("granted %d > bound %d", got, bound)
			}
			if float64(got) < 0.9*float64(floor) {
				t.Errorf("granted %d < 90%% of %d, the bound over the %v the callers asked", got, floor, deadline.Sub(start))
			}
		})
	}
}

// TestSettleUncharged: on every algorithm, with two limits on a key (10/s
// and WithLimits' 30/min), at a frozen instant, a Settle above a limit's
// room charges what each limit can take and reports the most any of them
// could not as Uncharged.
func TestSettleUncharged(t *testing.T) {
	tests := []struct {
		charged, used    int64
		bucket, windowed int64 // Uncharged
	}{
		// 10/s: room 20 (buckets) or 10 (windows); 30/min: 60 or 30.
		{0, 25, 5, 15},
		// 10/s: none; 30/min: 35 (level 5) or 5 (count 25).
		{0, 50, 50, 50},
		{0, 0, 0, 0},
		{2, 1, 0, 0}, // a give-back: nothing uncharged
	}
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			b := miniBackend(t)
			b.set(t0)
			l := newTenant(t, alg.new, b.rdb, tierlimit.PerSecond(10), WithLimits(tierlimit.PerMinute(30)))
			for i, tt := range tests {
				want := tt.bucket
				if alg.windowed {
					want = tt.windowed
				}
				r, err := l.Settle(context.Background(), "k", tt.charged, tt.used)
				if err != nil || !r.Allowed || r.Uncharged != want {
					t.Errorf("step %d: Settle(%d, %d) = %+v, %v; want Allowed, Uncharged %d", i, tt.charged, tt.used, r, err, want)
				}
			}
		})
	}
}
