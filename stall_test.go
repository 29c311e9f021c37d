package tierlimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/canary"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// stallFaults are the stalls of a Redis that keeps its state: every
// command held back (CLIENT PAUSE ALL) and the process stopped (SIGSTOP),
// each for stallFor; begin returns what ends the fault.
var stallFaults = []struct {
	name  string
	begin func(t *testing.T, s *redistest.Server) (end func())
}{
	{"client pause all", func(t *testing.T, s *redistest.Server) func() {
		if err := s.Client(t).Do(context.Background(), "CLIENT", "PAUSE", stallFor.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		return func() {} // the pause ends by itself
	}},
	{"sigstop", func(t *testing.T, s *redistest.Server) func() {
		s.Pause()
		return s.Resume
	}},
}

const stallFor = 3 * time.Second

// defaultClient returns go-redis's default client for s: no
// ContextTimeoutEnabled, so a call to a stalled Redis lasts its 3 s
// ReadTimeout, as most users build it.
func defaultClient(t *testing.T, s *redistest.Server) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestStalledRedisBoundsEveryMethod is G4 for the methods around AllowN,
// with default options and go-redis's default client beside a busy loop:
// while Redis is stalled, a Settle that gives back past the lease or takes
// what the lease lacks returns within 150 ms, Reset within 1 s, and Close,
// with such calls in flight, within 1.5 s; no Settle returns an error. After
// Redis returns, its bucket holds exactly what one bucket would after the
// caller's admissions and settlements, less the tokens Stats counts lost:
// nothing minted, nothing lost that Stats does not say.
func TestStalledRedisBoundsEveryMethod(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis twice for 3 s")
	}
	const (
		settleBound = 150 * time.Millisecond
		resetBound  = time.Second
		closeBound  = 1500 * time.Millisecond
	)
	for _, f := range stallFaults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := defaultClient(t, s)
			// A daily quota: no refill to speak of in the test's seconds, so
			// that the bucket's level is exact.
			limit := tierlimit.PerDay(1000)
			lim, err := hybrid.New(rdb, limit)
			if err != nil {
				t.Fatal(err)
			}
			closer, err := hybrid.New(rdb, limit)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var used int64 // what the caller used of key k, as one bucket counts it
			admit := func(key string, n int64) {
				t.Helper()
				r, err := lim.AllowN(ctx, key, n)
				if err != nil {
					t.Fatalf("AllowN(%q, %d) = %v", key, n, err)
				}
				if r.Allowed && key == "k" {
					used += n
				}
			}
			// Two leases of 100 (the largest the default bounds give a
			// burst of 1000): a give-back of 150 is past the lease.
			admit("k", 100)
			admit("k", 100)
			admit("r", 1)
			if r, err := closer.AllowN(ctx, "c", 5); err != nil || !r.Allowed {
				t.Fatalf("AllowN on the second limiter = %+v, %v", r, err)
			}
			stop := busyLoop(true)
			defer stop()

			end := f.begin(t, s)
			faultEnd := time.Now().Add(stallFor)
			// Reset as the stall begins (the breaker closed) and once the
			// breaker has opened: each waits for Redis at most its bound.
			start := time.Now()
			resetErr := lim.Reset(ctx, "r")
			resetTook := time.Since(start)
			var worstGive, worstTake time.Duration
			settles := 0
			for time.Until(faultEnd) > stallFor/3 {
				start := time.Now()
				if _, err := lim.Settle(ctx, "k", 150, 0); err != nil {
					t.Errorf("Settle(k, 150, 0) in the stall = %v, want no error", err)
				}
				worstGive = max(worstGive, time.Since(start))
				used -= 150
				start = time.Now()
				if _, err := lim.Settle(ctx, "k", 0, 150); err != nil {
					t.Errorf("Settle(k, 0, 150) in the stall = %v, want no error", err)
				}
				worstTake = max(worstTake, time.Since(start))
				used += 150
				settles++
				time.Sleep(50 * time.Millisecond)
			}
			start = time.Now()
			lateResetErr := lim.Reset(ctx, "r")
			lateResetTook := time.Since(start)

			// Close the second limiter with calls of every kind in flight.
			var callers sync.WaitGroup
			calls := []func(){
				func() { _, _ = closer.Settle(ctx, "c", 150, 0) },
				func() { _, _ = closer.Settle(ctx, "c", 0, 150) },
				func() { _ = closer.Reset(ctx, "c") },
				func() { _, _ = closer.AllowN(ctx, "c2", 1) },
				func() { _, _ = closer.AllowAll(ctx, tierlimit.Take{Key: "c", N: 1}, tierlimit.Take{Key: "c3", N: 1}) },
			}
			callersDone := make(chan struct{})
			for _, call := range calls {
				callers.Add(1)
				go func() {
					defer callers.Done()
					call()
				}()
			}
			go func() {
				callers.Wait()
				close(callersDone)
			}()
			time.Sleep(10 * time.Millisecond) // the calls are under way
			start = time.Now()
			closeErr := closer.Close()
			closeTook := time.Since(start)
			select {
			case <-callersDone:
			case <-time.After(closeBound):
				t.Errorf("G6: calls in flight at Close still blocked %v after it returned", closeBound)
			}

			time.Sleep(time.Until(faultEnd))
			end()
			t.Logf("in the stall: %d settle pairs, worst give-back %v, worst take %v; Reset took %v (%v), then %v (%v); Close took %v (%v)",
				settles, worstGive, worstTake, resetTook, resetErr, lateResetTook, lateResetErr, closeTook, closeErr)
			if worstGive > settleBound || worstTake > settleBound {
				t.Errorf("G4: the worst Settle took %v (give-back) and %v (take), want at most %v", worstGive, worstTake, settleBound)
			}
			if resetTook > resetBound || lateResetTook > resetBound {
				t.Errorf("G4: Reset took %v and %v in the stall, want at most %v", resetTook, lateResetTook, resetBound)
			}
			if closeTook > closeBound {
				t.Errorf("G4: Close took %v with calls in flight, want at most %v", closeTook, closeBound)
			}

			// Redis is back: the limiter charges what it owes (its claims
			// pay debts first, the janitor charges them), then closes.
			until := time.Now().Add(2 * time.Second)
			for time.Now().Before(until) {
				admit("k", 1)
				time.Sleep(20 * time.Millisecond)
			}
			if err := lim.Close(); err != nil {
				t.Errorf("Close after the stall = %v", err)
			}
			st := settledStats(lim)
			level := levelOf(t, rdb, limit, "k")
			want := limit.Capacity() - used - st.Lost
			t.Logf("Redis holds %d of k; the caller used %d, Stats: %d lost, %d charged back, %d refunded of %d leased",
				level, used, st.Lost, st.ChargedBack, st.Refunded, st.Leased)
			if level != want {
				t.Errorf("G1/G5: Redis holds %d of k after the stall, want %d (capacity %d - %d used - %d lost)",
					level, want, limit.Capacity(), used, st.Lost)
				t.Logf("Stats: %+v", st)
				logKeys(t, rdb)
			}
		})
	}
}

// TestStalledRedisHTTP: httplimit over two hybrid limiters, the second of
// which denies, so that every request's charge goes back to the first
// (Settle): while Redis is stalled no request waits longer than 150 ms.
func TestStalledRedisHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis twice for 3 s")
	}
	const bound = 150 * time.Millisecond
	for _, f := range stallFaults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := defaultClient(t, s)
			first, err := hybrid.New(rdb, tierlimit.PerSecond(1000))
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			second, err := hybrid.New(rdb, tierlimit.PerDay(1), hybrid.WithPrefix("second:"))
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close()
			mw, err := httplimit.New(first, httplimit.WithKey(httplimit.KeyHeader("X-User")),
				httplimit.WithLimiter("daily", second, httplimit.KeyHeader("X-User")))
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
			serve := func() (int, time.Duration) {
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				req.Header.Set("X-User", "u")
				rec := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(rec, req)
				return rec.Code, time.Since(start)
			}
			// The daily limit's one request, then its denials.
			for range 3 {
				serve()
			}
			stop := busyLoop(true)
			defer stop()
			// Each request is held to the bound plus what this process's
			// scheduler made a canary goroutine wait meanwhile: a busy
			// machine's delay, not the limiter's.
			c := canary.Start()
			defer c.Stop()
			end := f.begin(t, s)
			faultEnd := time.Now().Add(stallFor)
			var worst, worstLate, over time.Duration
			codes := map[int]int{}
			for time.Until(faultEnd) > 200*time.Millisecond {
				c.Reset()
				code, took := serve()
				late := c.Worst()
				codes[code]++
				if took > worst {
					worst, worstLate = took, late
				}
				over = max(over, took-late)
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(time.Until(faultEnd))
			end()
			t.Logf("in the stall: responses %v, worst request %v (scheduling delay meanwhile %v)", codes, worst, worstLate)
			if over > bound {
				t.Errorf("G4: a request took %v more than the scheduling delay in the stall, want at most %v", over, bound)
			}
			if codes[http.StatusOK] != 0 {
				t.Errorf("%d requests got 200 in the stall, want every one refused by the daily limit", codes[http.StatusOK])
			}
		})
	}
}

// TestForgottenClose: hybrid limiters dropped without Close (a newcomer
// builds one per request) are closed when the garbage collector finds
// them: their goroutines end, they leave the fleet (a new limiter counts
// itself alone, so its fallback keeps the whole limit), and their leases go
// back to Redis.
func TestForgottenClose(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	limit := tierlimit.PerHour(1000)
	base := runtime.NumGoroutine()
	func() {
		for range 20 {
			l, err := hybrid.New(rdb, limit)
			if err != nil {
				t.Fatal(err)
			}
			allowOnce(t, l)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+2 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		t.Fatalf("%d goroutines 10 s after 20 limiters were dropped, want about %d as before them", n, base)
	}
	l, err := hybrid.New(rdb, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Stats().Instances; got != 1 {
		t.Errorf("a new limiter counts %d instances, want 1: the dropped ones left the fleet", got)
	}
	if got, want := levelOf(t, rdb, limit, "k"), limit.Capacity()-20; got != want {
		t.Errorf("Redis holds %d of k after 20 admissions by dropped limiters, want %d: their leases went back", got, want)
	}
}

// allowOnce admits one call of key "k" on l, as a caller does: a denial
// because Redis answered a claim later than the call budget (a loaded
// machine: CI at a25f46c saw the first claim of a new limiter take longer
// than 25 ms once) is retried after its RetryAfter, at most 20 times.
func allowOnce(t *testing.T, l *hybrid.Limiter) {
	t.Helper()
	for try := 0; ; try++ {
		r, err := l.Allow(context.Background(), "k")
		if err == nil && r.Allowed {
			return
		}
		if err != nil || r.Source != tierlimit.SourceFallback || try == 20 {
			t.Fatalf("Allow = %+v, %v (try %d)", r, err, try)
		}
		time.Sleep(r.RetryAfter)
	}
}

// TestNewOnUnreachableRedis: hybrid.New on a Redis that does not answer (a
// closed loopback port), with go-redis's default client, returns within
// about half a second (its calls wait at most 250 ms each), and the limiter
// decides on its fallback without an error.
func TestNewOnUnreachableRedis(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer rdb.Close()
	start := time.Now()
	l, err := hybrid.New(rdb, tierlimit.PerSecond(100))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("New on an unreachable Redis = %v, want a limiter", err)
	}
	defer l.Close()
	if took > 750*time.Millisecond {
		t.Errorf("New on an unreachable Redis took %v, want at most 750ms", took)
	}
	for i := range 3 {
		if _, err := l.Allow(context.Background(), "k"); err != nil {
			t.Fatalf("Allow %d on an unreachable Redis = %v, want a decision", i, err)
		}
	}
	t.Logf("New took %v", took)
}

// logKeys logs every key Redis holds, with its value and TTL: what a
// failed check of a bucket's level needs to tell a record that still holds
// tokens from a level that lost them.
func logKeys(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Logf("KEYS: %v", err)
		return
	}
	for _, k := range keys {
		v, err := rdb.Get(ctx, k).Result()
		ttl := rdb.PTTL(ctx, k).Val()
		t.Logf("  %q = %q (%v, TTL %v)", k, v, err, ttl)
	}
}

// settledStats returns l's Stats once they stop changing (at most 5 s):
// a closed limiter's calls that ran past Close's wait still count what they
// land.
func settledStats(l *hybrid.Limiter) hybrid.Stats {
	st := l.Stats()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		next := l.Stats()
		if next.Leased == st.Leased && next.Lost == st.Lost && next.Refunded == st.Refunded {
			return next
		}
		st = next
	}
	return st
}

// TestRefundRunAfterItsTimeout: a refund whose call got no reply in time
// from a stopped Redis, which ran it when it resumed, is counted lost only
// until the janitor has asked Redis (the refund's marker): its tokens then
// count as refunded, and Redis's bucket holds exactly capacity - used -
// Stats.Lost. A client that gives up on a reply after 200 ms and never
// sends a command again makes the call fail while the refund waits in the
// stopped server's socket.
func TestRefundRunAfterItsTimeout(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	var sent atomic.Bool // a refund's call was made and failed
	obs := &tierlimit.Observer{RedisCall: func(c tierlimit.RedisCall) {
		if c.Op == "refund" && c.Err != nil {
			sent.Store(true)
		}
	}}
	limit := tierlimit.PerDay(1000) // no refill to speak of: the level is exact
	lim, err := hybrid.New(rdb, limit, hybrid.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	for range 2 {
		if r, err := lim.AllowN(ctx, "k", 100); err != nil || !r.Allowed {
			t.Fatalf("AllowN(k, 100) = %+v, %v", r, err)
		}
	}
	used := int64(200)
	// The lease's background refill lands first: one in flight at the
	// pause would hold the key while the breaker opens, and the refund
	// would not be sent at all (lost, rightly).
	time.Sleep(200 * time.Millisecond)

	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	// A give-back past the lease goes to Redis.
	if _, err := lim.Settle(ctx, "k", 150, 0); err != nil {
		t.Fatalf("Settle(k, 150, 0) = %v", err)
	}
	used -= 150
	if !eventually(3*time.Second, func() bool { return lim.Stats().Lost >= 150 }) {
		t.Fatalf("the refund not counted lost within 3 s: %+v", lim.Stats())
	}
	s.Resume()
	resumed = true
	if !sent.Load() {
		t.Log("the refund's call was not made (the breaker had opened): lost, rightly")
	} else if !eventually(5*time.Second, func() bool { return lim.Stats().Lost == 0 }) {
		t.Fatalf("the refund, sent and run, still counted lost 5 s after Redis resumed: %+v", lim.Stats())
	}
	if err := lim.Close(); err != nil { // its lease goes back too
		t.Fatalf("Close = %v", err)
	}

	st := lim.Stats()
	if got, want := levelOf(t, rdb, limit, "k"), limit.Capacity()-used-st.Lost; got != want {
		t.Errorf("Redis holds %d of k, want %d (capacity %d - %d used - %d lost); Stats %+v",
			got, want, limit.Capacity(), used, st.Lost, st)
	}
}

// levelOf returns the tokens Redis holds for key under limit (levels).
func levelOf(t *testing.T, rdb redis.UniversalClient, limit tierlimit.Limit, key string) int64 {
	t.Helper()
	return levels(t, rdb, limit, map[string]int64{key: 0})[key]
}

// eventually polls cond every 20 ms until it holds, at most for limit, and
// reports whether it did.
func eventually(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
