package hybrid

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
)

func TestShare(t *testing.T) {
	tests := []struct {
		limit tierlimit.Limit
		n     int64
		want  tierlimit.Limit
	}{
		{tierlimit.PerSecond(100), 1, tierlimit.PerSecond(100)},
		{tierlimit.PerSecond(100), 4, tierlimit.Limit{Rate: 25, Burst: 25, Period: time.Second}},
		{tierlimit.PerSecond(100), 3, tierlimit.Limit{Rate: 100, Burst: 33, Period: 3 * time.Second}},
		{tierlimit.PerSecond(10).WithBurst(40), 5, tierlimit.Limit{Rate: 2, Burst: 8, Period: time.Second}},
		{tierlimit.PerHour(2), 5, tierlimit.Limit{Rate: 2, Burst: 1, Period: 5 * time.Hour}},
		// A fleet too large for an exact share: one per period each.
		{tierlimit.Limit{Rate: 3, Period: 1 << 49 * time.Microsecond}, 7, tierlimit.Limit{Rate: 1, Burst: 1, Period: 1 << 49 * time.Microsecond}},
	}
	for _, tt := range tests {
		got := share(tt.limit, tt.n)
		if got != tt.want {
			t.Errorf("share(%v, %d) = %+v, want %+v", tt.limit, tt.n, got, tt.want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("share(%v, %d) = %v: %v", tt.limit, tt.n, got, err)
		}
	}
}

// FuzzShare checks that n shares never add up to more than the limit's
// rate, nor its burst by more than one token each, and are always valid.
func FuzzShare(f *testing.F) {
	f.Add(int64(100), int64(0), int64(1_000_000), int64(3))
	f.Add(int64(1), int64(1), int64(1), int64(1000))
	f.Fuzz(func(t *testing.T, rate, burst, periodUs, n int64) {
		limit := tierlimit.Limit{Rate: rate, Burst: burst, Period: time.Duration(periodUs) * time.Microsecond}
		if limit.Validate() != nil || n < 1 || n > 1<<20 {
			return
		}
		s := share(limit, n)
		if err := s.Validate(); err != nil {
			t.Fatalf("share(%v, %d) = %v: %v", limit, n, s, err)
		}
		// n·(s.Rate/s.Period) <= limit.Rate/limit.Period, in exact integers
		// where they fit.
		lhs, rhs := float64(n)*float64(s.Rate)*float64(limit.Period), float64(limit.Rate)*float64(s.Period)
		if lhs > rhs*(1+1e-12) && !(s.Rate == 1 && s.Burst == 1 && s.Period == limit.Period) {
			t.Errorf("share(%v, %d) = %v: %d shares exceed the rate", limit, n, s, n)
		}
		if n*s.Capacity() > max(limit.Capacity(), n) {
			t.Errorf("share(%v, %d) = %v: %d bursts exceed %d", limit, n, s, n, limit.Capacity())
		}
	})
}

// outage makes miniredis fail every command until the returned func heals
// it, as a dead Redis would (with an error go-redis does not retry: retries
// are the fault suite's business, on real servers).
func (e *env) outage() (heal func()) {
	e.m.SetError("ERR injected outage")
	return func() { e.m.SetError("") }
}

// waitFor polls cond for up to 5 s (real time: the breaker runs on it).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBreakerOpensAndHeals(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var changes []tierlimit.BreakerChange
	obs := &tierlimit.Observer{Breaker: func(c tierlimit.BreakerChange) {
		mu.Lock()
		changes = append(changes, c)
		mu.Unlock()
	}}
	probe := 50 * time.Millisecond
	l := e.limiter(t, tierlimit.PerSecond(10), WithLeaseBounds(1, 1),
		WithBreakerThreshold(3), WithProbeInterval(probe), WithFallback(tierlimit.PerSecond(2)), WithObserver(obs))
	heal := e.outage()
	// Three calls fail at Redis and fall back; then the breaker is open and
	// calls make no Redis call at all.
	for i := 0; i < 3; i++ {
		r, err := l.Allow(e.ctx, "k")
		if err != nil || r.Source != tierlimit.SourceFallback {
			t.Fatalf("call %d in the outage = %v from %v, want no error, fallback", i, err, r.Source)
		}
	}
	if s := l.Stats(); s.Breaker != tierlimit.BreakerOpen || s.BreakerOpens != 1 {
		t.Fatalf("after 3 failures: breaker %v, opened %d times; want open, 1", s.Breaker, s.BreakerOpens)
	}
	before := e.calls.Calls()
	for i := 0; i < 100; i++ {
		r, err := l.Allow(e.ctx, "k")
		if err != nil || r.Source != tierlimit.SourceFallback {
			t.Fatalf("call with the breaker open = %v from %v, want no error, fallback", err, r.Source)
		}
		if r.Allowed && r.Limit != tierlimit.PerSecond(2) {
			t.Errorf("fallback decided under %v, want the fallback limit", r.Limit)
		}
	}
	if got := e.calls.Calls() - before; got != 0 {
		t.Errorf("%d Redis calls with the breaker open, want 0", got)
	}
	// Redis answers again: within one probe interval, a call probes it and
	// leasing resumes.
	heal()
	healed := time.Now()
	waitFor(t, "a decision from Redis", func() bool {
		r, err := l.Allow(e.ctx, "k2")
		return err == nil && r.Source != tierlimit.SourceFallback
	})
	if d := time.Since(healed); d > probe+50*time.Millisecond {
		t.Errorf("leasing resumed %v after Redis healed, want within the probe interval %v (+50ms)", d, probe)
	}
	if s := l.Stats(); s.Breaker != tierlimit.BreakerClosed {
		t.Errorf("after healing: breaker %v, want closed", s.Breaker)
	}
	waitFor(t, "the observer to see open, half-open, closed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(changes) >= 3
	})
	mu.Lock()
	want := []tierlimit.BreakerChange{
		{From: tierlimit.BreakerClosed, To: tierlimit.BreakerOpen},
		{From: tierlimit.BreakerOpen, To: tierlimit.BreakerHalfOpen},
		{From: tierlimit.BreakerHalfOpen, To: tierlimit.BreakerClosed},
	}
	for i, w := range want {
		if changes[i] != w {
			t.Errorf("breaker change %d = %v -> %v, want %v -> %v", i, changes[i].From, changes[i].To, w.From, w.To)
		}
	}
	mu.Unlock()
}

// TestBreakerClosesWhileIdle: after an outage, a limiter that no caller
// asks closes its breaker by itself once Redis answers (its heartbeat is
// the half-open breaker's probe), rather than staying half-open until the
// next decision while its heartbeats succeed.
func TestBreakerClosesWhileIdle(t *testing.T) {
	e := newEnv(t)
	probe, beat := 50*time.Millisecond, 20*time.Millisecond
	l := e.limiter(t, tierlimit.PerSecond(10), WithLeaseBounds(1, 1),
		WithBreakerThreshold(3), WithProbeInterval(probe), WithHeartbeat(beat))
	heal := e.outage()
	for range 3 {
		if _, err := l.Allow(e.ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.Breaker != tierlimit.BreakerOpen {
		t.Fatalf("after 3 failures: breaker %v, want open", s.Breaker)
	}
	heal()
	healed := time.Now()
	waitFor(t, "the idle limiter's breaker to close", func() bool { return l.Stats().Breaker == tierlimit.BreakerClosed })
	if d := time.Since(healed); d > probe+2*beat+100*time.Millisecond {
		t.Errorf("the breaker closed %v after Redis healed, want within the probe interval and two heartbeats (%v, +100ms)", d, probe+2*beat)
	}
}

func TestFailureModes(t *testing.T) {
	for _, tt := range []struct {
		mode    FailureMode
		allowed int // of 10 calls
	}{
		{FailFallback, 3},
		{FailOpen, 10},
		{FailClosed, 0},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			e := newEnv(t)
			probe := 200 * time.Millisecond
			l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(5, 5), WithFailureMode(tt.mode),
				WithFallback(tierlimit.PerHour(3)), WithProbeInterval(probe))
			// A lease of 5 is held when Redis goes: it is spent first, in
			// every mode.
			if r, _ := l.Allow(e.ctx, "k"); !r.Allowed || r.Source != tierlimit.SourceRemote {
				t.Fatalf("first call = %v from %v, want allowed by Redis", r.Allowed, r.Source)
			}
			e.outage()
			for i := 0; i < 4; i++ {
				if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed {
					t.Fatalf("lease call %d in the outage = %v, %v; want allowed from the lease", i, r.Allowed, err)
				}
			}
			allowed := 0
			for i := 0; i < 10; i++ {
				r, err := l.Allow(e.ctx, "k")
				if err != nil {
					t.Fatalf("call %d in the outage: %v, want no error", i, err)
				}
				if r.Source != tierlimit.SourceFallback {
					t.Errorf("call %d from %v, want fallback", i, r.Source)
				}
				if r.Allowed {
					allowed++
				} else if tt.mode == FailClosed && r.RetryAfter != probe {
					t.Errorf("fail-closed denial: RetryAfter %v, want the probe interval %v", r.RetryAfter, probe)
				}
			}
			if allowed != tt.allowed {
				t.Errorf("%v: %d of 10 calls allowed in the outage, want %d", tt.mode, allowed, tt.allowed)
			}
		})
	}
}

func TestHeartbeatSetsFallbackShare(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerSecond(90)
	var ls []*Limiter
	for i := 0; i < 3; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: e.m.Addr()})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, limit, WithHeartbeat(10*time.Millisecond), WithCallBudget(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	// The first two counted fewer at New; a beat later all count three.
	waitFor(t, "every instance to count 3", func() bool {
		for _, l := range ls {
			if l.Stats().Instances != 3 {
				return false
			}
		}
		return true
	})
	for i, l := range ls {
		if got, want := l.Stats().FallbackLimit, (tierlimit.Limit{Rate: 30, Burst: 30, Period: time.Second}); got != want {
			t.Errorf("instance %d: fallback %v, want %v", i, got, want)
		}
	}
	// One leaves: the others count two at their next beat.
	ls[2].Close()
	waitFor(t, "the others to count 2", func() bool {
		return ls[0].Stats().Instances == 2 && ls[1].Stats().Instances == 2
	})
	if got, want := ls[0].Stats().FallbackLimit, (tierlimit.Limit{Rate: 45, Burst: 45, Period: time.Second}); got != want {
		t.Errorf("after one left: fallback %v, want %v", got, want)
	}
	// During an outage the last count stands.
	e.outage()
	time.Sleep(50 * time.Millisecond)
	if got := ls[0].Stats().Instances; got != 2 {
		t.Errorf("in an outage: %d instances, want the last count, 2", got)
	}
	// An explicit fallback is never overridden.
	e.m.SetError("")
	rdb := redis.NewClient(&redis.Options{Addr: e.m.Addr()})
	defer rdb.Close()
	l, err := New(rdb, limit, WithFallback(tierlimit.PerSecond(7)), WithHeartbeat(10*time.Millisecond), WithCallBudget(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	time.Sleep(30 * time.Millisecond)
	if s := l.Stats(); s.FallbackLimit != tierlimit.PerSecond(7) || s.Instances != 3 {
		t.Errorf("explicit fallback: %v with %d instances, want 7/s with 3", s.FallbackLimit, s.Instances)
	}
}

func TestLeasesExpiringInAnOutageAreLost(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(1000), WithLeaseBounds(100, 100), WithLeaseTTL(time.Second), WithBreakerThreshold(1))
	if r, _ := l.Allow(e.ctx, "k"); !r.Allowed {
		t.Fatal("denied")
	}
	e.outage()
	e.step(2 * time.Second)
	if err := l.refundHeld(e.clock.Now(), false); err == nil {
		t.Fatal("refund in an outage: no error, want one")
	}
	s := l.Stats()
	if s.Held != 0 || s.Lost != 99 || s.Refunded != 0 {
		t.Errorf("after expiry in an outage: held %d, lost %d, refunded %d; want 0, 99, 0", s.Held, s.Lost, s.Refunded)
	}
	checkLedger(t, s, 1)
	// The breaker is open now: the next refund is not even tried, and is
	// counted lost at once.
	calls := e.calls.Calls()
	if err := l.refund([]store.Refund{{Key: "k", N: 5}}, false); !errors.Is(err, errUnavailable) {
		t.Errorf("refund with the breaker open = %v, want errUnavailable", err)
	}
	if got := e.calls.Calls() - calls; got != 0 {
		t.Errorf("%d Redis calls for a refund with the breaker open, want 0", got)
	}
}

func TestMisconfiguredIsAnError(t *testing.T) {
	e := newEnv(t)
	e.m.RequireAuth("secret")
	// New finds it with its first heartbeat.
	if _, err := New(e.rdb, tierlimit.PerSecond(10)); !errors.Is(err, tierlimit.ErrMisconfigured) {
		t.Fatalf("New with a wrong password = %v, want ErrMisconfigured", err)
	}
	// A password revoked after New: AllowN reports it, and the breaker
	// does not open (it is not an outage).
	e.m.RequireAuth("")
	l := e.limiter(t, tierlimit.PerSecond(10), WithBreakerThreshold(1))
	e.m.RequireAuth("secret")
	e.rdb.Do(e.ctx, "CLIENT", "KILL", "TYPE", "normal") // drop the authenticated connections
	for i := 0; i < 3; i++ {
		if _, err := l.Allow(e.ctx, "k"); !errors.Is(err, tierlimit.ErrMisconfigured) {
			t.Fatalf("Allow with a revoked password = %v, want ErrMisconfigured", err)
		}
	}
	if s := l.Stats(); s.Breaker != tierlimit.BreakerClosed {
		t.Errorf("breaker %v after auth errors, want closed", s.Breaker)
	}
}

func TestObserver(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	decisions := map[tierlimit.Source]int{}
	calls := map[string]int{}
	obs := &tierlimit.Observer{
		Decision: func(d tierlimit.Decision) {
			mu.Lock()
			decisions[d.Source]++
			mu.Unlock()
			// A decision made in process is reported without a latency
			// (Decision.Latency); one that asked Redis, or fell back, with one.
			inProcess := d.Source == tierlimit.SourceLocal || d.Source == tierlimit.SourceBlocked
			if (d.Latency == 0) != inProcess || d.N != 1 {
				t.Errorf("decision %+v: want N 1 and a latency that is 0 just for in-process decisions", d)
			}
		},
		RedisCall: func(c tierlimit.RedisCall) {
			mu.Lock()
			calls[c.Op]++
			mu.Unlock()
		},
	}
	l := e.limiter(t, tierlimit.PerHour(20), WithLeaseBounds(10, 10), WithObserver(obs))
	for i := 0; i < 25; i++ {
		if _, err := l.Allow(e.ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	mu.Lock()
	defer mu.Unlock()
	// 2 leases of 10: 2 remote decisions, 18 local; then blocked.
	if decisions[tierlimit.SourceRemote] < 2 || decisions[tierlimit.SourceLocal] < 15 || decisions[tierlimit.SourceBlocked] < 1 {
		t.Errorf("decisions by source %v, want remote, local and blocked ones", decisions)
	}
	var total int
	for _, n := range decisions {
		total += n
	}
	if total != 25 {
		t.Errorf("%d decisions observed, want 25", total)
	}
	if calls["heartbeat"] < 2 || calls["claim"] < 1 || calls["claim"]+calls["refill"] < 2 {
		t.Errorf("Redis calls by op %v, want heartbeats (New, Close) and 2 claims or refills", calls)
	}
}

// slowScripts is a go-redis hook that delays every script call, as a slow
// Redis would. honest ends the call at the context's deadline, as a client
// with ContextTimeoutEnabled does; otherwise the delay ignores the context.
type slowScripts struct {
	delay  time.Duration
	honest bool
}

func (h slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		if !h.honest {
			time.Sleep(h.delay)
			return next(ctx, cmd)
		}
		select {
		case <-time.After(h.delay):
			return next(ctx, cmd)
		case <-ctx.Done():
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
	}
}

// lateReplies is a go-redis hook that answers every script call delay late,
// whatever the context's deadline: a slow Redis, or a process too busy to
// read its answers in time, with a client that does not end calls at their
// deadline (go-redis's default).
type lateReplies struct{ delay time.Duration }

func (h lateReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lateReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(h.delay)
		return next(context.WithoutCancel(ctx), cmds)
	}
}
func (h lateReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		time.Sleep(h.delay)
		return next(context.WithoutCancel(ctx), cmd)
	}
}

// TestSlowIsNotAnOutage is G1 and G4 with default options: a Redis that
// answers every call past the budget opens no breaker and the fallback
// admits nothing (decisions wait at most the budget; the claims that land
// late are spent by the next callers, within the bucket); a Redis that
// stops answering opens the breaker.
func TestSlowIsNotAnOutage(t *testing.T) {
	limit := tierlimit.PerHour(50) // no refill to speak of
	t.Run("slow", func(t *testing.T) {
		e := newEnv(t)
		l, err := New(e.rdb, limit, WithClock(e.clock))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		// Late by half a budget more than the budget: slow, yet well
		// inside the 4 budgets below which a call never counts as a
		// silence, on a machine loaded by the race detector too.
		e.rdb.AddHook(lateReplies{delay: 3 * DefaultCallBudget / 2})
		var admitted, fellBack int
		for range 60 {
			r, err := l.Allow(e.ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
				if r.Source == tierlimit.SourceFallback {
					fellBack++
				}
			}
		}
		st := l.Stats()
		t.Logf("%d admitted; stats %+v", admitted, st)
		if st.BreakerOpens != 0 || fellBack != 0 {
			t.Errorf("a slow Redis opened the breaker %d times and the fallback admitted %d, want 0 and 0", st.BreakerOpens, fellBack)
		}
		if admitted == 0 || admitted > int(limit.Capacity()) {
			t.Errorf("admitted %d, want between 1 (late claims are spent) and the bucket's %d", admitted, limit.Capacity())
		}
		if st.RedisErrors == 0 {
			t.Errorf("no call counted over its budget: the hook did not slow Redis down")
		}
	})
	t.Run("silent", func(t *testing.T) {
		e := newEnv(t)
		l, err := New(e.rdb, limit, WithClock(e.clock))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e.rdb.AddHook(lateReplies{delay: 400 * time.Millisecond})
		for i := 0; l.Stats().BreakerOpens == 0; i++ {
			if i == 40 { // a second of decisions, each waiting at most the budget
				t.Fatalf("a Redis silent for 400ms a call did not open the breaker: %+v", l.Stats())
			}
			if _, err := l.Allow(e.ctx, "k"); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestBudgetBoundsEveryDecision(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(100), WithCallBudget(slowBudget), WithBreakerThreshold(1000))
	e.rdb.AddHook(slowScripts{delay: slowCall})
	for i := 0; i < 5; i++ {
		start := time.Now()
		r, err := l.Allow(e.ctx, fmt.Sprint("k", i))
		took := time.Since(start)
		if err != nil || r.Source != tierlimit.SourceFallback {
			t.Fatalf("call %d with Redis slow = %v from %v, want no error, fallback", i, err, r.Source)
		}
		// The decision must not wait for the Redis call.
		if took > slowCall/2 {
			t.Errorf("call %d took %v with a %v budget, want far less than the %v Redis call", i, took, slowBudget, slowCall)
		}
	}
}

// slowBudget and slowCall are the call budget and the Redis call of the
// tests that check the budget bounds a decision: a budget a loaded CI
// machine's miniredis call stays within (with 20 ms, a fast claim under
// -race and load fell back), and a call ten budgets long, of which a
// decision must wait at most half.
const (
	slowBudget = 100 * time.Millisecond
	slowCall   = 10 * slowBudget
)

// TestInlineClaims: with a client that honours deadlines, claims run on the
// caller's goroutine (no hand-off), and the budget still bounds each
// decision, through the context.
func TestInlineClaims(t *testing.T) {
	e := newEnv(t)
	rdb := redis.NewClient(&redis.Options{Addr: e.m.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, tierlimit.PerSecond(100), WithClock(e.clock), WithCallBudget(slowBudget), WithBreakerThreshold(1000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if !l.inline {
		t.Fatal("a client with ContextTimeoutEnabled: claims not inline")
	}
	if r, err := l.Allow(e.ctx, "fast"); err != nil || r.Source != tierlimit.SourceRemote {
		t.Fatalf("Allow = %v from %v, want a claim from Redis", err, r.Source)
	}
	rdb.AddHook(slowScripts{delay: slowCall, honest: true})
	for i := 0; i < 5; i++ {
		start := time.Now()
		r, err := l.Allow(e.ctx, fmt.Sprint("slow", i))
		took := time.Since(start)
		if err != nil || r.Source != tierlimit.SourceFallback {
			t.Fatalf("call %d with Redis slow = %v from %v, want no error, fallback", i, err, r.Source)
		}
		if took > slowCall/2 {
			t.Errorf("call %d took %v with a %v budget, want far less than the %v Redis call", i, took, slowBudget, slowCall)
		}
	}
	if e.rdb.Options().ContextTimeoutEnabled || newEnv(t).limiter(t, tierlimit.PerSecond(1)).inline {
		t.Error("a client without ContextTimeoutEnabled: claims inline, want them on the flight's goroutine")
	}
}

// TestCloseRefundsWithTheBreakerOpen: Close's refunds are the last chance,
// so they are sent even while the breaker holds calls back.
func TestCloseRefundsWithTheBreakerOpen(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(1000)
	// e.limiter's generous call budget: with the default 25 ms, a claim
	// slowed by a loaded CI machine timed out, opened the breaker
	// (threshold 1) before the outage and left the first decision to the
	// fallback.
	l := e.limiter(t, limit, WithLeaseBounds(100, 100), WithBreakerThreshold(1), WithProbeInterval(time.Minute))
	if r, _ := l.Allow(e.ctx, "k"); !r.Allowed || r.Source == tierlimit.SourceFallback {
		t.Fatalf("first decision %+v, want allowed from a lease", r)
	}
	heal := e.outage()
	if r, _ := l.Allow(e.ctx, "other"); r.Source != tierlimit.SourceFallback {
		t.Fatalf("call in the outage from %v, want fallback", r.Source)
	}
	heal()
	if s := l.Stats(); s.Breaker != tierlimit.BreakerOpen {
		t.Fatalf("breaker %v, want open (no probe for a minute)", s.Breaker)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close = %v, want the refunds sent", err)
	}
	s := l.Stats()
	checkLedger(t, s, 1)
	if s.Refunded != 99 || s.Lost != 0 {
		t.Errorf("refunded %d, lost %d; want 99, 0", s.Refunded, s.Lost)
	}
	if got := e.level(t, e.limiter(t, limit), "k"); got != 999 {
		t.Errorf("Redis holds %d, want 999 (capacity - the one admitted)", got)
	}
}

// TestFallbackStartsFromTheKeysState: once the breaker is open, a key's
// fallback bucket holds what Redis last said the key had (nothing for a
// key known to be blocked or never claimed), not a fresh burst; and when
// Redis answers again, what the fallback admitted is charged to the
// bucket, never below empty, and what the bucket lacks stays owed until
// it refills.
func TestFallbackStartsFromTheKeysState(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(100) // no refill to speak of while the test runs
	l := e.limiter(t, limit, WithLeaseBounds(1, 1), WithProbeInterval(20*time.Millisecond))
	fellBack := int64(0) // admitted by a fallback, so to be charged back
	allow := func(key string, n int) (got int) {
		t.Helper()
		for range n {
			r, err := l.Allow(e.ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				got++
				if r.Source == tierlimit.SourceFallback {
					fellBack++
				}
			}
		}
		return got
	}
	if got := allow("drained", 101); got != 100 {
		t.Fatalf("drained: %d admitted, want 100", got)
	}
	if got := allow("used", 30); got != 30 {
		t.Fatalf("used: %d admitted, want 30", got)
	}
	if got := allow("shared", 60); got != 60 {
		t.Fatalf("shared: %d admitted, want 60", got)
	}
	heal := e.outage()
	for i := 0; l.Stats().BreakerOpens == 0; i++ {
		if i == 100 {
			t.Fatal("the breaker did not open in the outage")
		}
		allow("trip"+strconv.Itoa(i), 1)
	}
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"drained", 0}, // known to be blocked
		{"used", 70},   // Redis said 70 were left
		{"shared", 40}, // Redis said 40 were left
		{"new", 0},     // never claimed: maybe drained by others
	} {
		if got := allow(tc.key, 150); got != tc.want {
			t.Errorf("%s: the fallback admitted %d in the outage, want %d", tc.key, got, tc.want)
		}
	}
	heal()
	// Another instance took 30 of shared's 40 meanwhile: of the 40 owed,
	// Redis can be charged 10 now, and 30 more as the bucket refills.
	other := e.limiter(t, limit, WithLeaseBounds(1, 1))
	for range 30 {
		if r, err := other.Allow(e.ctx, "shared"); err != nil || !r.Allowed {
			t.Fatalf("the other instance's Allow(shared) = %+v, %v; want allowed", r, err)
		}
	}
	waitFor(t, "the breaker to close", func() bool {
		allow("probe", 1)
		return l.Stats().Breaker == tierlimit.BreakerClosed
	})
	// The first claim of a key that owes pays first: "used" has nothing
	// left for new callers.
	if r, err := l.Allow(e.ctx, "used"); err != nil || r.Allowed {
		t.Errorf("used, after the outage = %+v, %v; want denied: the fallback spent what Redis held", r, err)
	}
	// The janitor charges the keys nobody asked for since.
	if err := l.refundHeld(e.clock.Now(), true); err != nil {
		t.Fatal(err)
	}
	l.chargeBack(l.keys.holding())
	st := l.Stats()
	for _, tc := range []struct {
		key  string
		want int64
	}{
		{"drained", 0}, {"used", 0}, {"shared", 0}, {"new", 100},
	} {
		if got := e.level(t, l, tc.key); got != tc.want {
			t.Errorf("%s: Redis holds %d after the charge-back, want %d", tc.key, got, tc.want)
		}
	}
	if st.ChargedBack != fellBack-30 || fellBack < 110 || st.Leased != st.Spent+st.Refunded+st.Lost+st.Held {
		t.Errorf("stats %+v: want %d charged back, what the fallback admitted but 30, and the ledger balanced", st, fellBack-30)
	}
	// An hour refills the bucket: the 30 still owed are charged, and
	// shared holds 70 for new callers.
	e.step(time.Hour)
	l.chargeBack(l.keys.holding())
	if got := e.level(t, l, "shared"); got != 70 {
		t.Errorf("shared: Redis holds %d an hour later, want 70 (100 but the 30 still owed)", got)
	}
	if st := l.Stats(); st.ChargedBack != fellBack {
		t.Errorf("charged back %d in all, want %d: every token the fallback admitted", st.ChargedBack, fellBack)
	}
}

// TestChargeBackCarriesDebt: what the bucket lacks when a debt is charged
// is forgiven if the bucket was full (it dropped refill at its cap, or lost
// its state: one bucket would have given it), and then marked so that the
// other instances' charges forgive theirs too; otherwise it stays owed for
// one lease TTL, at most a second, from the first charge (other instances
// leased it while this one fell back), then is forgiven.
func TestChargeBackCarriesDebt(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(100)
	l := e.limiter(t, limit)
	ttl := l.debtWindow()
	if ttl != time.Second {
		t.Fatalf("debtWindow() = %v at the default lease TTL, want 1s", ttl)
	}
	type charge struct {
		after                time.Duration // since the previous charge
		since                int64         // admitted by the fallback while the charge was in flight
		asked, granted, left int64         // the claim's want, its grant, the bucket's level after it
		wantOwed             int64
		want                 debtOutcome
	}
	for _, tc := range []struct {
		name    string
		owed    int64
		charges []charge
	}{
		{"paid", 40, []charge{{0, 0, 40, 40, 50, 0, debtSettled}}},
		{"bucket was full", 240, []charge{{0, 0, 100, 100, 0, 0, debtFull}}},
		{"drained by others", 40, []charge{
			{0, 0, 40, 10, 0, 30, debtShort},
			{ttl / 2, 0, 30, 5, 0, 25, debtShort},
			{ttl/2 - time.Millisecond, 0, 25, 0, 0, 25, debtShort},
			{time.Millisecond, 0, 25, 0, 0, 0, debtSettled},
		}},
		{"paid within the TTL", 40, []charge{
			{0, 0, 40, 0, 0, 40, debtShort},
			{ttl / 2, 0, 40, 40, 0, 0, debtSettled},
			{ttl, 0, 0, 0, 0, 0, debtSettled},
		}},
		// What the fallback admitted during a charge that got all it asked
		// is a new debt: its window starts at its own first short charge,
		// not at that charge.
		{"admitted during the charge", 40, []charge{
			{0, 10, 40, 40, 50, 10, debtSettled},
			{ttl, 0, 10, 0, 0, 10, debtShort},
			{ttl, 0, 10, 0, 0, 0, debtSettled},
		}},
		{"admitted during the charge of a full bucket", 40, []charge{{0, 10, 40, 40, 60, 10, debtSettled}}},
	} {
		e := &entry{key: tc.name}
		e.pol.Store(l.def)
		e.owed.Store(tc.owed)
		for i, c := range tc.charges {
			l.cfg.clock.(*clocktest.Clock).Add(c.after)
			e.owed.Add(c.since)
			// No other holder's records: the bucket stood at its ceiling
			// if its level and this charge's grant (recorded) fill it.
			g := store.Grant{Granted: c.granted, Result: tierlimit.Result{Remaining: c.left}, Full: c.granted+c.left >= limit.Capacity()}
			got := l.paid(e, c.asked, g)
			if owed := e.owed.Load(); owed != c.wantOwed || got != c.want {
				t.Errorf("%s: charge %d (%d of %d granted, %d left): owed %d, outcome %d; want %d, %d",
					tc.name, i, c.granted, c.asked, c.left, owed, got, c.wantOwed, c.want)
			}
		}
	}
	// A bucket another instance found full is marked: a debt the bucket
	// cannot pay is forgiven; one on an unmarked bucket stays owed.
	marked, unmarked := &entry{key: "marked"}, &entry{key: "unmarked"}
	marked.pol.Store(l.def)
	unmarked.pol.Store(l.def)
	for _, en := range []*entry{marked, unmarked} {
		en.owed.Store(30)
	}
	l.settleMarks(e.ctx, []*entry{{key: "marked"}}, nil, false)
	l.settleMarks(e.ctx, nil, []*entry{marked, unmarked}, false)
	if marked.owed.Load() != 0 || unmarked.owed.Load() != 30 {
		t.Errorf("after the marks: owed %d on the marked bucket, %d on the other; want 0, 30", marked.owed.Load(), unmarked.owed.Load())
	}
	e.m.FastForward(l.markTTL() + time.Millisecond)
	marked.owed.Store(30)
	if l.settleMarks(e.ctx, nil, []*entry{marked}, false); marked.owed.Load() != 30 {
		t.Errorf("a mark past its TTL forgave a debt: owed %d, want 30", marked.owed.Load())
	}
}

// TestChargeBackInBatches: the janitor charges many keys' debts
// refillBatch claims a round trip, so that no call keeps Redis from
// answering others for long (a call over the budget is a failure for the
// breaker), and charges them all.
func TestChargeBackInBatches(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int64
	obs := &tierlimit.Observer{RedisCall: func(c tierlimit.RedisCall) {
		if c.Op == "chargeback" {
			calls.Add(1)
		}
	}}
	// The janitor's rounds, a quarter of the lease TTL apart, do not come
	// during the test: its one charge is the test's.
	l := e.limiter(t, tierlimit.PerHour(100), WithObserver(obs), WithLeaseTTL(time.Hour))
	const keys = 3*refillBatch + 1
	var entries []*entry
	for i := range keys {
		key := "k" + strconv.Itoa(i)
		if r, err := l.AllowN(e.ctx, key, 1); err != nil || !r.Allowed {
			t.Fatalf("AllowN = %+v, %v", r, err)
		}
		en, ok := l.lookup(key)
		if !ok {
			t.Fatalf("no entry for %s", key)
		}
		en.owed.Store(2) // what the fallback admitted in an outage
		entries = append(entries, en)
	}
	l.chargeBack(entries)
	var owed int64
	for _, en := range entries {
		owed += en.owed.Load()
	}
	if got, want := calls.Load(), int64(4); got != want || owed != 0 || l.Stats().ChargedBack != 2*keys {
		t.Errorf("charging %d keys: %d calls, %d owed after, %d charged back; want %d, 0, %d",
			keys, got, owed, l.Stats().ChargedBack, want, 2*keys)
	}
}

// TestChargeBackHandsOverALostGrant: a charge of a debt whose claim also
// hands over what an earlier claim's lost reply granted (store.Claim's
// Received) pays the debt and no more: the rest is the lease's, refunded
// at Close, not charged back and never spent. Redis then holds exactly
// capacity - admitted.
func TestChargeBackHandsOverALostGrant(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100))
	if r, err := l.AllowN(e.ctx, "k", 1); err != nil || !r.Allowed {
		t.Fatalf("AllowN(k, 1) = %+v, %v", r, err)
	}
	en, ok := l.lookup("k")
	if !ok {
		t.Fatal("no entry for k after a claim")
	}
	// A claim of 5 that Redis grants but whose reply never comes (a call
	// past the client's read timeout): the ledger records it handed.
	mu := l.keyLock("k")
	mu.Lock()
	if granted, _, err := l.bucket.Lease(e.ctx, "k", l.claimOf(en, 0, 5)); err != nil || granted != 5 {
		t.Fatalf("Lease(k, 5) = %d, %v; want 5 granted", granted, err)
	}
	l.replied(en, 0, context.DeadlineExceeded)
	mu.Unlock()
	// The fallback admitted 3 meanwhile; Redis answers again.
	en.owed.Add(3)
	l.chargeBack(l.keys.holding())
	if owed, st := en.owed.Load(), l.Stats(); owed != 0 || st.ChargedBack != 3 {
		t.Errorf("after the charge: owed %d, charged back %d; want 0, 3", owed, st.ChargedBack)
	}
	e.closeAndAudit(t, l, 1+3, map[string]int64{"k": 1 + 3})
}

// TestGrantPaysDebtFirst: a claim that lands while its key owes what the
// fallback admitted (sent before an outage, run by Redis after it) pays the
// debt before its tokens are spent.
func TestGrantPaysDebtFirst(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100))
	for _, tc := range []struct {
		name                     string
		owed, granted, remaining int64
		wantOwed, wantHeld       int64
		wantFull                 bool
	}{
		{"no debt", 0, 30, 70, 0, 30, false},
		{"debt over the grant, bucket full", 40, 30, 70, 10, 0, true},
		{"debt over the grant", 40, 30, 10, 10, 0, false},
		{"debt under the grant", 10, 30, 10, 0, 20, false},
	} {
		en := &entry{key: tc.name}
		en.pol.Store(l.def)
		en.owed.Store(tc.owed)
		l.apply(en, 30, tc.granted, tierlimit.Result{Allowed: true, Remaining: tc.remaining})
		if en.owed.Load() != tc.wantOwed || en.tokens.Load() != tc.wantHeld {
			t.Errorf("%s: owed %d, held %d; want %d, %d", tc.name, en.owed.Load(), en.tokens.Load(), tc.wantOwed, tc.wantHeld)
		}
	}
	if st := l.Stats(); st.ChargedBack != 30+30+10 {
		t.Errorf("charged back %d, want 70: what the grants paid", st.ChargedBack)
	}
}

// TestFallbackBeyondMaxKeys: in an outage, keys that ristretto will not
// hold (ten times WithMaxKeys) still get one fallback bucket each, not one
// per decision, and the table follows about one dropped entry per key,
// however many decisions, AllowN's and AllowAll's; new debts stop at
// WithMaxKeys dropped entries (the keys past that are denied); when Redis answers again, their debts are
// charged and the table forgets them.
func TestFallbackBeyondMaxKeys(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerHour(5)
	const maxKeys, keys, calls = 10, 100, 20
	l := e.limiter(t, limit, WithMaxKeys(maxKeys), WithLeaseBounds(1, 1), WithProbeInterval(20*time.Millisecond))
	heal := e.outage()
	for i := 0; l.Stats().BreakerOpens == 0; i++ {
		if i == 100 {
			t.Fatal("the breaker did not open in the outage")
		}
		l.Allow(e.ctx, "trip"+strconv.Itoa(i))
	}
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		admitted := 0
		for c := range calls {
			// AllowN and AllowAll in turn: both decide on the fallback.
			var r tierlimit.Result
			var err error
			if c%2 == 0 {
				r, err = l.Allow(e.ctx, key)
			} else {
				r, err = l.AllowAll(e.ctx, tierlimit.Take{Key: key, N: 1})
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			}
		}
		if admitted > int(limit.Capacity()) {
			t.Errorf("%s: the fallback admitted %d of %d, want at most %d (one bucket per key)", key, admitted, calls, limit.Capacity())
		}
	}
	if n := len(l.keys.droppedNow()); n > keys+maxKeys {
		t.Errorf("the table follows %d dropped entries after %d decisions on %d keys, want at most %d", n, keys*calls, keys, keys+maxKeys)
	}
	owing := 0
	for _, e := range l.keys.droppedNow() {
		if e.owed.Load() > 0 {
			owing++
		}
	}
	if owing > 2*maxKeys { // the cached entries may owe too, and be dropped later
		t.Errorf("%d dropped entries owe Redis, want at most twice WithMaxKeys, %d", owing, 2*maxKeys)
	}
	heal()
	waitFor(t, "the breaker to close", func() bool {
		l.Allow(e.ctx, "probe")
		return l.Stats().Breaker == tierlimit.BreakerClosed
	})
	if err := l.refundHeld(e.clock.Now(), true); err != nil {
		t.Fatal(err)
	}
	l.chargeBack(l.keys.holding())
	l.refundHeld(e.clock.Now(), true) // forgets the dropped entries charged
	if n := len(l.keys.droppedNow()); n != 0 {
		t.Errorf("the table follows %d dropped entries after the charge-back, want 0", n)
	}
}

// TestReplicaAtRunTime: a server that becomes a read-only replica after
// New (a failover the client did not follow) answers READONLY, which
// go-redis retries for longer than a decision's budget: the heartbeat,
// which waits longer, finds the misconfiguration, and decisions return
// ErrMisconfigured within a few heartbeats rather than falling back
// silently (G4). With default options and go-redis's default client.
func TestReplicaAtRunTime(t *testing.T) {
	primary, other := redistest.Start(t), redistest.Start(t)
	rdb := primary.Client(t)
	ctx := context.Background()
	l, err := New(rdb, tierlimit.PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Allow(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	admin := primary.Client(t)
	host, port, _ := strings.Cut(other.Addr, ":")
	if err := admin.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(ctx, "REPLICAOF", "NO", "ONE")
	var misconfigured, silent int
	deadline := time.Now().Add(5 * DefaultHeartbeat)
	for i := 0; time.Now().Before(deadline) && misconfigured < 20; i++ {
		_, err := l.Allow(ctx, "k"+strconv.Itoa(i))
		switch {
		case errors.Is(err, tierlimit.ErrMisconfigured):
			misconfigured++
		case err != nil:
			t.Fatalf("Allow = %v, want nil or ErrMisconfigured", err)
		default:
			silent++
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("after REPLICAOF: %d decisions before the first ErrMisconfigured; stats %+v", silent, l.Stats())
	if misconfigured < 20 {
		t.Errorf("%d decisions returned ErrMisconfigured within %v of REPLICAOF, want every one after the next heartbeat",
			misconfigured, 5*DefaultHeartbeat)
	}
}

// TestMemoryBoundedInAnOutage is G6 while the breaker is open: 200,000 new
// keys decided on the fallback (none of which claims, holds or owes
// anything) keep the live heap within WithMaxKeys' bound, n × 1 KiB +
// 8 MiB. Entries ristretto dropped used to stay followed until the
// janitor's next round: 19 MB for 300,000 keys in 3 s.
func TestMemoryBoundedInAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("decides 200,000 keys")
	}
	e := newEnv(t)
	const maxKeys = 1000
	l := e.limiter(t, tierlimit.PerMinute(10), WithMaxKeys(maxKeys), WithProbeInterval(time.Minute))
	before := liveHeap()
	e.outage()
	for l.Stats().BreakerOpens == 0 {
		if _, err := l.Allow(e.ctx, "trip"); err != nil {
			t.Fatal(err)
		}
	}
	var peak uint64
	for i := range 200_000 {
		if _, err := l.Allow(e.ctx, "user-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if i%20_000 == 0 {
			peak = max(peak, liveHeap())
		}
	}
	peak = max(peak, liveHeap())
	grew, bound := int64(peak)-int64(before), int64(maxKeys*1024+8<<20)
	t.Logf("live heap grew at most %d bytes, bound %d; the table follows %d dropped entries", grew, bound, l.keys.droppedLen())
	if grew > bound {
		t.Errorf("G6: the live heap grew %d bytes in an outage, more than %d", grew, bound)
	}
}

// liveHeap returns the bytes the heap holds live after a garbage
// collection (runtime/metrics), not counting what was allocated since.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
