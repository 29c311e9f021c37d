package local

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
)

// plans is a LimitFunc whose answers a test changes: a key's plan, or the
// default (the zero Limit) for a key without one.
type plans struct {
	mu sync.Mutex
	m  map[string]tierlimit.Limit
}

func newPlans(kv ...any) *plans {
	p := &plans{m: map[string]tierlimit.Limit{}}
	for i := 0; i < len(kv); i += 2 {
		p.m[kv[i].(string)] = kv[i+1].(tierlimit.Limit)
	}
	return p
}

func (p *plans) set(key string, l tierlimit.Limit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[key] = l
}

func (p *plans) limit(key string) tierlimit.Limit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[key]
}

// step is one call of a sequence and what it must return.
type step struct {
	advance   time.Duration
	n         int64
	allowed   bool
	remaining int64
	retry     time.Duration
}

func runSteps(t *testing.T, l *Limiter, clock interface{ Add(time.Duration) time.Time }, key string, steps []step) {
	t.Helper()
	for i, s := range steps {
		clock.Add(s.advance)
		r, err := l.AllowN(context.Background(), key, s.n)
		if err != nil {
			t.Fatalf("step %d: AllowN(%q, %d): %v", i, key, s.n, err)
		}
		if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry {
			t.Errorf("step %d: AllowN(%q, %d) = %v, %d, %v; want %v, %d, %v",
				i, key, s.n, r.Allowed, r.Remaining, r.RetryAfter, s.allowed, s.remaining, s.retry)
		}
	}
}

// TestPlanChange: a key drained at 100/s that moves to 1000/s gets no
// fresh burst, and the new rate at once, the part of a token it had
// refilled carried over; a full key that moves down is capped at the new
// burst, exactly.
func TestPlanChange(t *testing.T) {
	p := newPlans("tenant", tierlimit.PerSecond(100), "big", tierlimit.PerSecond(1000))
	l, clock := newTest(t, tierlimit.PerSecond(7), WithLimitFunc(p.limit))
	runSteps(t, l, clock, "tenant", []step{
		{0, 100, true, 0, 0},
		{0, 1, false, 0, 10 * time.Millisecond},
		{5 * time.Millisecond, 1, false, 0, 5 * time.Millisecond}, // half a token at 100/s
	})
	p.set("tenant", tierlimit.PerSecond(1000))
	runSteps(t, l, clock, "tenant", []step{
		// Half a token carried: the next is 0.5 ms away at 1000/s.
		{0, 1, false, 0, 500 * time.Microsecond},
		{500 * time.Microsecond, 1, true, 0, 0},
		{0, 1, false, 0, time.Millisecond},
		{10 * time.Millisecond, 10, true, 0, 0},
		{time.Second, 1000, true, 0, 0}, // the new burst once refilled
	})
	if r, _ := l.AllowN(context.Background(), "tenant", 0); r.Limit != tierlimit.PerSecond(1000) {
		t.Errorf("Result.Limit = %v, want 1000/1s", r.Limit)
	}
	// Down: a full bucket of 1000 keeps 100, not 1000 nor a fresh 100 later.
	p.set("big", tierlimit.PerSecond(100))
	runSteps(t, l, clock, "big", []step{
		{0, 0, true, 100, 0},
		{0, 100, true, 0, 0},
		{0, 1, false, 0, 10 * time.Millisecond},
	})
	// The default is 7/s for keys without a plan, and SetLimit moves them
	// only.
	runSteps(t, l, clock, "nobody", []step{{0, 7, true, 0, 0}, {0, 1, false, 0, 142_858 * time.Microsecond}})
	if err := l.SetLimit(tierlimit.PerSecond(3)); err != nil {
		t.Fatal(err)
	}
	runSteps(t, l, clock, "nobody", []step{{time.Second, 0, true, 3, 0}})
	runSteps(t, l, clock, "tenant", []step{{0, 0, true, 1000, 0}})
}

// TestLimitFuncErrors: an invalid limit from the function is an error
// wrapping ErrInvalidLimit on every call, never a panic nor an admission,
// and the key's state is kept for when the function is right again.
func TestLimitFuncErrors(t *testing.T) {
	p := newPlans("k", tierlimit.PerSecond(10))
	l, _ := newTest(t, tierlimit.PerSecond(5), WithLimitFunc(p.limit))
	ctx := context.Background()
	if r, _ := l.AllowN(ctx, "k", 8); !r.Allowed {
		t.Fatal("AllowN(k, 8) = false, want true")
	}
	bad := []tierlimit.Limit{{Rate: -1, Period: time.Second}, {Rate: 1}, {Rate: 1, Period: time.Nanosecond},
		tierlimit.PerSecond(1).WithBurst(1 << 52)}
	for _, b := range bad {
		p.set("k", b)
		p.set("new", b)
		for _, key := range []string{"k", "new"} {
			calls := map[string]func() error{
				"AllowN": func() error { _, err := l.AllowN(ctx, key, 1); return err },
				"AllowAll": func() error {
					_, err := l.AllowAll(ctx, tierlimit.Take{Key: "ok", N: 1}, tierlimit.Take{Key: key, N: 1})
					return err
				},
				"WaitN":  func() error { _, err := l.WaitN(ctx, key, 1); return err },
				"Settle": func() error { _, err := l.Settle(ctx, key, 1, 0); return err },
			}
			for name, call := range calls {
				if err := call(); !errors.Is(err, tierlimit.ErrInvalidLimit) || !strings.HasPrefix(err.Error(), "local: ") {
					t.Errorf("%s(%q) under %+v = %v, want a local: error wrapping ErrInvalidLimit", name, key, b, err)
				}
			}
		}
	}
	p.set("k", tierlimit.PerSecond(10))
	if r, _ := l.AllowN(ctx, "k", 0); r.Remaining != 2 {
		t.Errorf("back under 10/s: Remaining = %d, want 2 (the state before the bad limits)", r.Remaining)
	}
	if r, _ := l.AllowN(ctx, "ok", 0); r.Remaining != 5 {
		t.Errorf("the good key of a refused AllowAll: Remaining = %d, want 5 (not charged)", r.Remaining)
	}
	if _, err := New(tierlimit.PerSecond(1), WithLimitFunc(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WithLimitFunc(nil) = %v, want ErrInvalidOption", err)
	}
}

// orgAndUsers is a LimitFunc: "org…" keys at 20/s, "user…" keys at
// 1000/s, others at the limiter's default.
func orgAndUsers(key string) tierlimit.Limit {
	switch {
	case strings.HasPrefix(key, "org"):
		return tierlimit.PerSecond(20)
	case strings.HasPrefix(key, "user"):
		return tierlimit.PerSecond(1000)
	}
	return tierlimit.Limit{}
}

// TestAllowAllOrgOverUsers: users at 1000/s under an org at 20/s. At one
// instant the org's burst is all that is admitted and the refusals charge
// nothing: a user can still take 900 afterwards. Over 10 s of 1 ms steps,
// the org admits exactly its one-bucket bound.
func TestAllowAllOrgOverUsers(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(1), WithLimitFunc(orgAndUsers))
	ctx := context.Background()
	admitted := 0
	for i := range 1000 {
		r, err := l.AllowAll(ctx, tierlimit.Take{Key: "user1", N: 1}, tierlimit.Take{Key: "org", N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		} else if r.Limit != tierlimit.PerSecond(20) || r.RetryAfter != 50*time.Millisecond {
			t.Fatalf("call %d: denied with %v, RetryAfter %v; want the org's 20/1s, 50ms", i, r.Limit, r.RetryAfter)
		}
	}
	if admitted != 20 {
		t.Errorf("1000 AllowAll at one instant admitted %d, want 20 (the org's burst)", admitted)
	}
	if r, _ := l.AllowN(ctx, "user1", 900); !r.Allowed || r.Remaining != 80 {
		t.Errorf("user1 then takes 900 = %v, Remaining %d; want true, 80 (980 left: refusals charged nothing)", r.Allowed, r.Remaining)
	}

	clock.Add(time.Second) // the org full again
	admitted = 0
	for ms := range 10_000 {
		user := fmt.Sprint("user", ms%50)
		if r, _ := l.AllowAll(ctx, tierlimit.Take{Key: user, N: 1}, tierlimit.Take{Key: "org", N: 1}); r.Allowed {
			admitted++
		}
		clock.Add(time.Millisecond)
	}
	// Burst 20 + 20/s over the 9.999 s between the first and last call.
	if want := 20 + 199; admitted != want {
		t.Errorf("10 s of calls each ms admitted %d, want %d: the org's bound, met", admitted, want)
	}
}

// TestAllowAllResult: the Result is the most restrictive take's; takes of
// one key add up, and a sum over a key's burst is refused, charging
// nothing (the other input rules are TestInputRules's, at the module's
// root).
func TestAllowAllResult(t *testing.T) {
	l, _ := newTest(t, tierlimit.PerSecond(10), WithLimitFunc(orgAndUsers))
	ctx := context.Background()
	r, err := l.AllowAll(ctx, tierlimit.Take{Key: "user", N: 500}, tierlimit.Take{Key: "org", N: 5}, tierlimit.Take{Key: "x", N: 2})
	if err != nil || !r.Allowed || r.Remaining != 8 || r.Limit != tierlimit.PerSecond(10) {
		t.Errorf("AllowAll(user 500, org 5, x 2) = %+v, %v; want allowed, x's Remaining 8 (the smallest)", r, err)
	}
	r, err = l.AllowAll(ctx, tierlimit.Take{Key: "user", N: 501}, tierlimit.Take{Key: "org", N: 10}, tierlimit.Take{Key: "org", N: 11})
	if !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("AllowAll(org 10 + 11 > burst 20) = %+v, %v; want ErrInvalidCost", r, err)
	}
	// The org lacks 3 (150 ms), the user 1 (1 ms): the org's denial.
	r, err = l.AllowAll(ctx, tierlimit.Take{Key: "user", N: 501}, tierlimit.Take{Key: "org", N: 10}, tierlimit.Take{Key: "org", N: 8})
	if err != nil || r.Allowed || r.RetryAfter != 150*time.Millisecond || r.Remaining != 15 || r.Limit != tierlimit.PerSecond(20) {
		t.Errorf("AllowAll(user 501, org 10+8) = %+v, %v; want denied by the org: 150ms, Remaining 15", r, err)
	}
	for key, want := range map[string]int64{"user": 500, "org": 15, "x": 8} {
		if r, _ := l.AllowN(ctx, key, 0); r.Remaining != want {
			t.Errorf("%s after refused calls: Remaining %d, want %d", key, r.Remaining, want)
		}
	}
}

// TestAllowAllConcurrent: AllowAlls over overlapping keys, given in every
// order, from many goroutines on a frozen clock: none deadlocks, and each
// key was charged exactly the takes of the admitted calls (all or
// nothing, nothing lost).
func TestAllowAllConcurrent(t *testing.T) {
	// Not newTest: after a deadlock, its cleanup's Close would wait forever.
	l, err := New(tierlimit.PerHour(1000), WithClock(clocktest.New(time.Unix(1_700_000_000, 0))))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c", "d", "e"}
	var charged [5]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				idx := rng.Perm(len(keys))[:2+rng.IntN(3)]
				takes := make([]tierlimit.Take, len(idx))
				for i, k := range idx {
					takes[i] = tierlimit.Take{Key: keys[k], N: 1 + int64(rng.IntN(3))}
				}
				r, err := l.AllowAll(context.Background(), takes...)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					for i, k := range idx {
						charged[k].Add(takes[i].N)
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("AllowAll callers still blocked after 20s: a deadlock")
	}
	defer l.Close()
	for i, k := range keys {
		r, _ := l.AllowN(context.Background(), k, 0)
		if got := 1000 - r.Remaining; got != charged[i].Load() {
			t.Errorf("key %s: bucket charged %d, admitted calls took %d", k, got, charged[i].Load())
		}
	}
}

// TestSettle: a refund after an over-estimate restores exactly the
// difference, an under-estimate takes it, capped at the burst, and into
// debt below empty (bad costs are TestInputRules's, at the module's root).
func TestSettle(t *testing.T) {
	p := newPlans("llm", tierlimit.PerMinute(10_000))
	l, _ := newTest(t, tierlimit.PerSecond(5), WithLimitFunc(p.limit))
	ctx := context.Background()
	if r, _ := l.AllowN(ctx, "llm", 4000); r.Remaining != 6000 {
		t.Fatalf("charge of the estimate: Remaining %d, want 6000", r.Remaining)
	}
	for i, c := range []struct {
		charged, used, remaining int64
	}{
		{4000, 1234, 8766}, // over-estimate: 2766 back
		{100, 350, 8516},   // under-estimate: 250 more
		{0, 10_000, 0},     // more than is left: 1484 in debt, never refused
		{10_000, 0, 8516},  // the debt repaid first (was 10000: floored at empty)
		{5000, 0, 10_000},  // capped at the burst
		{7, 7, 10_000},
	} {
		r, err := l.Settle(ctx, "llm", c.charged, c.used)
		if err != nil || !r.Allowed || r.Remaining != c.remaining || r.Limit != tierlimit.PerMinute(10_000) {
			t.Errorf("%d: Settle(%d, %d) = %+v, %v; want allowed, Remaining %d under 10000/1m", i, c.charged, c.used, r, err, c.remaining)
		}
	}
}
