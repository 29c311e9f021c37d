package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// TestEffectiveWindow checks t against the draft's §4.1.2: the time
// within which the key can use no more than its Remaining.
func TestEffectiveWindow(t *testing.T) {
	perMin100 := tierlimit.PerMinute(100) // a token every 600 ms
	perHour10 := tierlimit.PerHour(10)    // a token every 6 min
	allow := func(l tierlimit.Limit, rem int64, reset time.Duration) tierlimit.Result {
		return tierlimit.Result{Allowed: true, Limit: l, Remaining: rem, ResetAfter: reset}
	}
	deny := func(l tierlimit.Limit, rem int64, retry, reset time.Duration) tierlimit.Result {
		return tierlimit.Result{Limit: l, Remaining: rem, RetryAfter: retry, ResetAfter: reset}
	}
	for _, tc := range []struct {
		name string
		res  tierlimit.Result
		want time.Duration
	}{
		// Token buckets: the next token, not the full bucket.
		{"drained bucket", allow(perMin100, 0, time.Minute), 600 * time.Millisecond},
		{"drained bucket, a fraction back", allow(perMin100, 0, time.Minute-100*time.Millisecond), 500 * time.Millisecond},
		{"bucket with 3.5 tokens", allow(perHour10, 3, 6*time.Minute*13/2), 3 * time.Minute},
		{"bucket one token short", allow(perHour10, 9, 4*time.Minute), 4 * time.Minute},
		{"full bucket: one interval after spending", allow(perHour10, 10, 0), 6 * time.Minute},
		{"bucket with burst", allow(tierlimit.PerSecond(1).WithBurst(100), 0, 100*time.Second), time.Second},
		// Windows: everything comes back when the window moves on.
		{"fixed window, 10 of 100 used", allow(perMin100, 90, 30*time.Second), 30 * time.Second},
		{"fixed window, drained", allow(perMin100, 0, 30*time.Second), 30 * time.Second},
		// Several limits (remote.WithLimits): ResetAfter is the slowest
		// limit's, past the deciding one's Period.
		{"2/s deciding, 5/min full in 12 s", allow(tierlimit.PerSecond(2), 1, 12*time.Second), 500 * time.Millisecond},
		{"100/min deciding, 1000/day full in 2 h", allow(perMin100, 3, 2*time.Hour), 600 * time.Millisecond},
		// Denials: never past RetryAfter.
		{"denied bucket", deny(perMin100, 0, 600*time.Millisecond, time.Minute), 600 * time.Millisecond},
		{"denied cost 5, 2 left", deny(perMin100, 2, 1800*time.Millisecond, 58800*time.Millisecond), 600 * time.Millisecond},
		{"denied window", deny(perMin100, 0, 20*time.Second, 20*time.Second), 20 * time.Second},
		{"denied, window past RetryAfter", deny(perMin100, 0, 5*time.Second, 30*time.Second), 5 * time.Second},
		// No limit to reason with: ResetAfter, or RetryAfter.
		{"no limit", tierlimit.Result{Allowed: true, ResetAfter: 7 * time.Second}, 7 * time.Second},
		{"no limit, denied", tierlimit.Result{RetryAfter: 3 * time.Second, ResetAfter: 7 * time.Second}, 3 * time.Second},
	} {
		if got := effectiveWindow(tc.res); got != tc.want {
			t.Errorf("%s: effectiveWindow(%+v) = %v, want %v", tc.name, tc.res, got, tc.want)
		}
	}
}

// stepClock is a clock tests move by hand.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestEffectiveWindowHolds checks what t promises on a real token bucket
// (local): within t seconds the key gets no more than r, and a client
// that waits t seconds gets one more.
func TestEffectiveWindowHolds(t *testing.T) {
	for _, tc := range []struct {
		limit tierlimit.Limit
		spent int64 // requests sent at once before the one that reports
		want  string
	}{
		{tierlimit.PerMinute(100), 99, `"default:100/1m";r=0;t=1`},
		{tierlimit.PerMinute(2), 1, `"default:2/1m";r=0;t=30`},
		{tierlimit.PerHour(10), 4, `"default:10/1h";r=5;t=360`},
		{tierlimit.PerSecond(1).WithBurst(5), 4, `"default:1/1s burst 5";r=0;t=1`},
	} {
		t.Run(tc.limit.String(), func(t *testing.T) {
			clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
			lim, err := local.New(tc.limit, local.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			m := mustNew(t, lim)
			for range tc.spent {
				serve(m, request("192.0.2.1:1"))
			}
			w := serve(m, request("192.0.2.1:1"))
			checkField(t, w.Header(), "RateLimit", tc.want)
			it := parseField(t, w.Header(), "RateLimit")[0]
			r, sec := it.params["r"].(int64), it.params["t"].(int64)

			// Now: r and no more.
			admitted := int64(0)
			for serve(m, request("192.0.2.1:1")).Code == http.StatusOK {
				admitted++
			}
			if admitted != r {
				t.Errorf("%d admitted at once, want r=%d", admitted, r)
			}
			// A second before t ends (t is rounded up): still nothing.
			clock.add(time.Duration(sec-1) * time.Second)
			if code := serve(m, request("192.0.2.1:1")).Code; code != http.StatusTooManyRequests {
				t.Errorf("%d s later, within t=%d s: got %d, want 429", sec-1, sec, code)
			}
			// At t: one more.
			clock.add(time.Second)
			if code := serve(m, request("192.0.2.1:1")).Code; code != http.StatusOK {
				t.Errorf("after waiting t=%d s: got %d, want 200", sec, code)
			}
		})
	}
}

// TestQuotaNames checks that one name never stands for two quotas: limits
// that differ get names that differ, and one limit gets one name.
func TestQuotaNames(t *testing.T) {
	ru := &rule{prefix: `"api`}
	for _, tc := range []struct {
		l    tierlimit.Limit
		want string
	}{
		{tierlimit.PerSecond(10), `"api:10/1s"`},
		{tierlimit.PerSecond(10).WithBurst(10), `"api:10/1s"`}, // Burst 10 is Burst 0
		{tierlimit.PerSecond(10).WithBurst(50), `"api:10/1s burst 50"`},
		{tierlimit.Limit{Rate: 600, Period: time.Minute}, `"api:600/1m"`},
		{tierlimit.Limit{Rate: 1, Period: 90 * time.Second}, `"api:1/90s"`},
		{tierlimit.PerDay(1_000_003), `"api:1000003/24h"`},
		{tierlimit.Limit{Rate: 3, Period: 1500 * time.Millisecond}, `"api:3/1500ms"`}, // q=4;w=2, like 4/2s
		{tierlimit.Limit{Rate: 4, Period: 2 * time.Second}, `"api:4/2s"`},
		{tierlimit.Limit{Rate: 1, Period: 250 * time.Microsecond}, `"api:1/250us"`},
		{tierlimit.Limit{}, `"api"`},
	} {
		if got := string(appendQuotaName(nil, ru, tc.l)); got != tc.want {
			t.Errorf("quota name of %v = %s, want %s", tc.l, got, tc.want)
		}
	}
}

// TestPerKeyLimits: with limits per key (a LimitFunc: a plan per API
// key), each key's headers advertise its own quota, from the Result of
// its own decision, under a name of its own.
func TestPerKeyLimits(t *testing.T) {
	plans := map[string]tierlimit.Limit{"k-free": tierlimit.PerSecond(10), "k-pro": tierlimit.PerMinute(6000).WithBurst(200)}
	lim := newFake(tierlimit.PerSecond(1), time.Second, time.Second)
	lim.limitOf = func(key string) tierlimit.Limit { return plans[key] }
	m := mustNew(t, lim, WithName("api"), WithKey(KeyHeader("X-API-Key")))
	for _, tc := range []struct {
		key, policy, rateLimit string
	}{
		{"k-free", `"api:10/1s";q=10;w=1`, `"api:10/1s";r=9;t=1`},
		{"k-pro", `"api:6000/1m burst 200";q=6000;w=60`, `"api:6000/1m burst 200";r=199;t=1`},
		{"k-other", `"api:1/1s";q=1;w=1`, `"api:1/1s";r=0;t=1`}, // the default
		{"k-free", `"api:10/1s";q=10;w=1`, `"api:10/1s";r=8;t=1`},
	} {
		w := serve(m, request("192.0.2.1:1", "X-API-Key", tc.key))
		checkField(t, w.Header(), "RateLimit-Policy", tc.policy)
		checkField(t, w.Header(), "RateLimit", tc.rateLimit)
	}
}

// TestSeveralLimitsOneLimiter: a limiter with several limits on one key
// (remote.WithLimits) reports the limit that decided, which changes from
// one request to the next: each under its own name.
func TestSeveralLimitsOneLimiter(t *testing.T) {
	perSec, perHour := tierlimit.PerSecond(5), tierlimit.PerHour(1000)
	lim := &scriptLimiter{results: []tierlimit.Result{
		{Allowed: true, Limit: perSec, Remaining: 4, ResetAfter: 200 * time.Millisecond},
		{Allowed: true, Limit: perHour, Remaining: 2, ResetAfter: 3590 * time.Second}, // 2.2 tokens
		{Limit: perSec, Remaining: 0, RetryAfter: 200 * time.Millisecond, ResetAfter: time.Second},
	}}
	m := mustNew(t, lim, WithName("api"))
	names := map[string]string{} // name -> policy item
	for i, want := range []string{`"api:5/1s";r=4;t=1`, `"api:1000/1h";r=2;t=1`, `"api:5/1s";r=0;t=1`} {
		w := serve(m, request("192.0.2.1:1"))
		checkField(t, w.Header(), "RateLimit", want)
		p := parseField(t, w.Header(), "RateLimit-Policy")[0]
		if prev, seen := names[p.name]; seen && prev != p.String() {
			t.Errorf("request %d: policy %s, but %s before: one name for two quotas", i+1, p, prev)
		}
		names[p.name] = p.String()
	}
	if len(names) != 2 {
		t.Errorf("policies %v, want 2 names for 2 limits", names)
	}
}

// scriptLimiter answers with results in turn.
type scriptLimiter struct {
	mu      sync.Mutex
	results []tierlimit.Result
	i       int
}

func (s *scriptLimiter) AllowN(_ context.Context, _ string, _ int64) (tierlimit.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.results[s.i%len(s.results)]
	s.i++
	return res, nil
}

// TestQuotaNamesCache checks the cache of quota names: the names of
// cached and uncached limits are those appendQuotaName formats, a
// limiter that hands out many limits neither grows it past
// maxQuotaNames nor allocates per request, and concurrent requests agree
// (for the race detector).
func TestQuotaNamesCache(t *testing.T) {
	const limits = 3 * maxQuotaNames
	lim := newFake(tierlimit.PerSecond(1), time.Second, time.Second)
	lim.limitOf = func(key string) tierlimit.Limit {
		n, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
		return tierlimit.PerMinute(int64(100 + n))
	}
	m := mustNew(t, lim, WithName("api"), WithKey(KeyHeader("X-API-Key")))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range limits {
				n := (i + g*7) % limits
				w := serve(m, request("192.0.2.1:1", "X-API-Key", fmt.Sprintf("k%d", n)))
				want := fmt.Sprintf("api:%d/1m", 100+n)
				if it := parseField(t, w.Header(), "RateLimit")[0]; it.name != want {
					t.Errorf("key k%d: RateLimit names %q, want %q", n, it.name, want)
				}
			}
		}()
	}
	wg.Wait()
	if got := len(*m.rules[0].names.list.Load()); got != maxQuotaNames {
		t.Errorf("%d names cached after %d limits, want %d", got, limits, maxQuotaNames)
	}
	if raceEnabled {
		return
	}
	// Allocations per request, against the same requests to a limiter of
	// one limit: the names of uncached limits cost none.
	rs := make([]*http.Request, limits)
	for i := range rs {
		rs[i] = request("192.0.2.1:1", "X-API-Key", fmt.Sprintf("k%d", i))
	}
	perRequest := func(m *Middleware) float64 {
		h, w := m.Handler(ok), &nopWriter{h: http.Header{}}
		i := 0
		return allocs(4*limits, func() {
			clear(w.h)
			h.ServeHTTP(w, rs[i%limits])
			i++
		})
	}
	one := newFake(tierlimit.PerSecond(1), time.Second, time.Second)
	base := perRequest(mustNew(t, one, WithName("api"), WithKey(KeyHeader("X-API-Key"))))
	if got := perRequest(m); got > base+0.01 {
		t.Errorf("%.3f allocations per request over %d limits, want %.3f as with one limit", got, limits, base)
	}
}
