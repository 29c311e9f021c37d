package hybrid

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestAllowAtMost drains a key with AllowAtMost against the one-bucket
// answer: every call grants at least 1 while the bucket holds a whole
// token and never more than it holds; then, the bucket empty, a denial
// tells the wait for one token (at least the exact answer, at most a
// refill interval more: G2), also when the bucket holds part of a token,
// and a caller that waits it is granted.
func TestAllowAtMost(t *testing.T) {
	e := newEnv(t)
	lim := tierlimit.PerSecond(10)
	l := e.limiter(t, lim)
	got, r, err := l.AllowAtMost(e.ctx, "k", 4)
	if err != nil || got != 4 || !r.Allowed || r.Remaining != 6 {
		t.Fatalf("AllowAtMost(k, 4) on a full bucket of 10 = %d, %+v, %v; want 4, allowed, Remaining 6", got, r, err)
	}
	// The lease holds what is left of the first claim, or none: the
	// instance alone on the key is granted all the bucket holds.
	if got, r, err := l.AllowAtMost(e.ctx, "k", 100); err != nil || got != 6 || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("AllowAtMost(k, 100) with 6 left = %d, %+v, %v; want 6, allowed, Remaining 0", got, r, err)
	}
	total := int64(10)
	// Empty at 0 ms; part of a token at 50 ms; one at 100 ms.
	var waited time.Duration
	for i := 0; ; i++ {
		got, r, err := l.AllowAtMost(e.ctx, "k", 5)
		if err != nil {
			t.Fatal(err)
		}
		if got > 0 {
			if waited < lim.Every() || got != 1 || !r.Allowed {
				t.Fatalf("AllowAtMost(k, 5) %v after the bucket emptied = %d, %+v; want 1, allowed, not before %v",
					waited, got, r, lim.Every())
			}
			break
		}
		exact := max(lim.Every()-waited, 0)
		if r.Allowed || r.RetryAfter < exact || r.RetryAfter > exact+DefaultRefillInterval || i == 5 {
			t.Fatalf("AllowAtMost(k, 5) %v after the bucket emptied = 0, %+v; want denied, RetryAfter in [%v, %v]",
				waited, r, exact, exact+DefaultRefillInterval)
		}
		step := r.RetryAfter
		if i == 0 {
			step = lim.Every() / 2 // part of a token
		}
		e.step(step)
		waited += step
	}
	// Above the burst: what the bucket holds.
	if got, r, err := l.AllowAtMost(e.ctx, "k2", 1000); err != nil || got != 10 || !r.Allowed {
		t.Errorf("AllowAtMost(k2, 1000) on a full bucket of 10 = %d, %+v, %v; want 10", got, r, err)
	}
	e.closeAndAudit(t, l, total+1+10, map[string]int64{"k2": 10})
}

// TestAllowAtMostLimitFunc: a key its LimitFunc blocks is granted nothing;
// a key of a smaller limit is granted what its own bucket holds.
func TestAllowAtMostLimitFunc(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithLimitFunc(func(key string) tierlimit.Limit {
		switch key {
		case "blocked":
			return tierlimit.Blocked
		case "small":
			return tierlimit.PerSecond(3)
		}
		return tierlimit.Limit{}
	}))
	for range 2 { // the second from the entry
		if got, r, err := l.AllowAtMost(e.ctx, "blocked", 5); err != nil || got != 0 || r.Allowed || r.Limit != tierlimit.Blocked {
			t.Errorf("AllowAtMost(blocked, 5) = %d, %+v, %v; want 0, denied under tierlimit.Blocked", got, r, err)
		}
	}
	if got, r, err := l.AllowAtMost(e.ctx, "small", 5); err != nil || got != 3 || r.Limit != tierlimit.PerSecond(3) {
		t.Errorf("AllowAtMost(small, 5) = %d, %+v, %v; want 3 under 3/1s", got, r, err)
	}
}

// TestAllowAtMostFallback: while Redis is down, AllowAtMost grants what
// the key's fallback bucket holds, and no more.
func TestAllowAtMostFallback(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithLeaseBounds(1, 3), WithBreakerThreshold(3))
	if got, _, err := l.AllowAtMost(e.ctx, "k", 3); err != nil || got != 3 {
		t.Fatalf("AllowAtMost(k, 3) = %d, %v; want 3", got, err)
	}
	heal := e.outage()
	defer heal()
	waitFor(t, "the breaker to open", func() bool {
		l.AllowAtMost(e.ctx, "other", 1)
		return l.Stats().Breaker == tierlimit.BreakerOpen
	})
	// The fallback starts from the 7 Redis last had (one instance), and
	// the clock stands still.
	got, r, err := l.AllowAtMost(e.ctx, "k", 100)
	if err != nil || got != 7 || !r.Allowed || r.Source != tierlimit.SourceFallback {
		t.Fatalf("AllowAtMost(k, 100) on the fallback = %d, %+v, %v; want 7 from the fallback", got, r, err)
	}
	if got, r, err := l.AllowAtMost(e.ctx, "k", 100); err != nil || got != 0 || r.Allowed || r.RetryAfter != 100*time.Millisecond {
		t.Errorf("AllowAtMost(k, 100) on the drained fallback = %d, %+v, %v; want 0, denied, RetryAfter 100ms", got, r, err)
	}
}

// TestAllowAtMostFleet: three instances, on a real Redis with default
// options and go-redis's default client, take one key with AllowAtMost
// from 8 goroutines each for a bounded time: together they are granted at
// most what one bucket holds over that time, and most of it.
func TestAllowAtMostFleet(t *testing.T) {
	srv := redistest.Start(t)
	lim := tierlimit.PerSecond(200).WithBurst(50)
	var limiters []*Limiter
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, lim)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		limiters = append(limiters, l)
	}
	ctx := context.Background()
	const run = 1500 * time.Millisecond
	var granted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 24 {
		l := limiters[i%3]
		wg.Go(func() {
			for time.Since(start) < run {
				got, _, err := l.AllowAtMost(ctx, "k", 1+int64(i%7)*3)
				if err != nil {
					t.Error(err)
					return
				}
				granted.Add(got)
				if got == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := lim.Capacity() + int64(elapsed.Seconds()*float64(lim.Rate)) + 1
	t.Logf("granted %d in %v, one bucket %d", granted.Load(), elapsed, bound)
	if got := granted.Load(); got > bound || got < bound*8/10 {
		t.Errorf("granted %d in %v, want at most one bucket's %d and at least 80%% of it", got, elapsed, bound)
	}
}

// TestOverrunBound: a tenant overrunning every estimate by 50% uses, over
// every interval, at most one bucket plus one request's overrun
// (tenanttest.CheckOverrun), with hybrid's leases and ledger on
// miniredis's clock.
func TestOverrunBound(t *testing.T) {
	for _, c := range []struct {
		limit tierlimit.Limit
		est   int64
	}{
		{tierlimit.PerSecond(100), 10},
		{tierlimit.PerSecond(3).WithBurst(7), 4},
		{tierlimit.PerMinute(1_000_003), 200_000},
	} {
		t.Run(c.limit.String(), func(t *testing.T) {
			e := newEnv(t)
			l := e.limiter(t, c.limit)
			set := func(at time.Time) {
				e.clock.Set(at)
				e.m.SetTime(at)
			}
			n := tenanttest.CheckOverrun(t, l, "k", c.limit, c.est, e.clock.Now(), 2*c.limit.RefillTime(c.est), 1000, set)
			t.Logf("estimate %d: %d of 1000 admitted", c.est, n)
		})
	}
}

// TestAllowAtMostConcurrent: 32 goroutines call AllowAtMost on one key
// until denied, the clock standing still: one bucket in all, never more
// (tenanttest.CheckAtMostConcurrent).
func TestAllowAtMostConcurrent(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(5000))
	tenanttest.CheckAtMostConcurrent(t, l, "hot", 5000, 32)
}

// TestAllowAtMostPastTheLease: a lease that holds part of n claims the
// rest from Redis, in one call, and the caller is granted n; a key Redis
// is known to be short on is granted what its lease holds, without a call.
func TestAllowAtMostPastTheLease(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(20, 20))
	if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed {
		t.Fatalf("Allow(k) = %+v, %v", r, err)
	}
	before := e.calls.Calls()
	if got, r, err := l.AllowAtMost(e.ctx, "k", 50); err != nil || got != 50 || r.Remaining != 49 {
		t.Errorf("AllowAtMost(k, 50) with 19 in the lease = %d, %+v, %v; want 50, Remaining 49", got, r, err)
	}
	if got := e.calls.Calls() - before; got != 1 {
		t.Errorf("AllowAtMost made %d Redis calls, want 1", got)
	}
	// Drain Redis: the claim that finds it short leaves the key known
	// short, and the next call takes the lease's tokens alone.
	if got, _, err := l.AllowAtMost(e.ctx, "k", 60); err != nil || got != 49 {
		t.Fatalf("AllowAtMost(k, 60) with 49 left = %d, %v; want 49", got, err)
	}
	if got, r, err := l.AllowAtMost(e.ctx, "k", 5); err != nil || got != 0 || r.Allowed {
		t.Errorf("AllowAtMost(k, 5) on an empty key = %d, %+v, %v; want 0, denied", got, r, err)
	}
	e.closeAndAudit(t, l, 100, map[string]int64{"k": 100})
}

// TestExactModeLeasesNothing: in exact mode (leases of one token) a claim
// of several tokens for one caller (AllowN(4), AllowAtMost) queues no
// background refill: the instance holds none, and Redis holds what one
// bucket would. (A refill landing after the claim made TestAllowAtMost see
// Remaining 5 instead of 6 once, in a full -race run.)
func TestExactModeLeasesNothing(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10)) // Burst 10: leases of 1
	if r, err := l.AllowN(e.ctx, "k", 4); err != nil || !r.Allowed {
		t.Fatalf("AllowN(k, 4) = %+v, %v; want allowed", r, err)
	}
	if got, _, err := l.AllowAtMost(e.ctx, "k", 3); err != nil || got != 3 {
		t.Fatalf("AllowAtMost(k, 3) = %d, %v; want 3", got, err)
	}
	refilled(t, l)
	if held := l.Stats().Held; held != 0 {
		t.Errorf("exact mode holds %d tokens after its callers' claims, want 0", held)
	}
	if got := e.level(t, l, "k"); got != 3 {
		t.Errorf("Redis holds %d, want 3 (10 - 7 taken)", got)
	}
}
