package hybrid

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestAllowAllChargesNoRefusal has five users share an org: each call
// takes 1 from its user and 5 from the org. Once the org is drained every
// call is refused, and Redis ends holding exactly what the admitted calls
// took, from every key: the refusals took nothing.
func TestAllowAllChargesNoRefusal(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100))
	users := []string{"u0", "u1", "u2", "u3", "u4"}
	spent := map[string]int64{}
	var admitted, refused int
	for i := 0; i < 200; i++ {
		u := users[i%len(users)]
		r, err := l.AllowAll(e.ctx, tierlimit.Take{Key: u, N: 1}, tierlimit.Take{Key: "org", N: 5})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			refused++
			if r.RetryAfter <= 0 {
				t.Fatalf("call %d refused with RetryAfter %v, want > 0", i, r.RetryAfter)
			}
			continue
		}
		admitted++
		spent[u]++
		spent["org"] += 5
	}
	if admitted != 20 {
		t.Errorf("admitted %d calls, want 20 (the org's 100 tokens, 5 a call)", admitted)
	}
	e.closeAndAudit(t, l, spent["org"]+int64(admitted), spent)
}

// TestAllowAllLeaseAllOrNothing holds a lease on one key while the other
// is blocked: the call is refused, and the lease keeps every token.
func TestAllowAllLeaseAllOrNothing(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(20, 20))
	if r, err := l.Allow(e.ctx, "a"); err != nil || !r.Allowed {
		t.Fatalf("Allow(a) = %+v, %v", r, err)
	}
	if r, err := l.AllowN(e.ctx, "b", 100); err != nil || !r.Allowed {
		t.Fatalf("AllowN(b, 100) = %+v, %v", r, err)
	}
	if r, err := l.Allow(e.ctx, "b"); err != nil || r.Allowed {
		t.Fatalf("Allow(b) drained = %+v, %v; want refused", r, err)
	}
	ea, _ := l.lookup("a")
	held := ea.tokens.Load()
	calls := e.calls.Calls()
	r, err := l.AllowAll(e.ctx, tierlimit.Take{Key: "a", N: 2}, tierlimit.Take{Key: "b", N: 1})
	if err != nil || r.Allowed {
		t.Fatalf("AllowAll(a 2, b 1) with b drained = %+v, %v; want refused", r, err)
	}
	if got := ea.tokens.Load(); got != held {
		t.Errorf("a's lease holds %d after the refusal, want %d", got, held)
	}
	if got := e.calls.Calls() - calls; got != 0 {
		t.Errorf("refusal for a blocked key made %d Redis calls, want 0", got)
	}
	r, err = l.AllowAll(e.ctx, tierlimit.Take{Key: "a", N: 2}, tierlimit.Take{Key: "a", N: 3})
	if err != nil || !r.Allowed {
		t.Fatalf("AllowAll(a 2, a 3) = %+v, %v; want allowed", r, err)
	}
	if got, want := ea.tokens.Load(), held-5; got != want {
		t.Errorf("a's lease holds %d, want %d (takes of one key add up)", got, want)
	}
	e.closeAndAudit(t, l, 106, map[string]int64{"a": 6, "b": 100})
}

// TestAllowAllFallback decides AllowAll while Redis is gone: the keys'
// fallback buckets decide all or nothing, and what they admit is owed to
// Redis.
func TestAllowAllFallback(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithFallback(tierlimit.PerSecond(3)))
	e.m.Close()
	for l.Stats().BreakerOpens == 0 {
		if _, err := l.Allow(e.ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	// Neither key was claimed: their fallbacks start empty, and 2 s later
	// hold their burst of 3.
	l.Allow(e.ctx, "b")
	e.clock.Add(2 * time.Second)
	if r, _ := l.AllowN(e.ctx, "b", 3); !r.Allowed {
		t.Fatalf("AllowN(b, 3) from the fallback = %+v, want allowed", r)
	}
	r, err := l.AllowAll(e.ctx, tierlimit.Take{Key: "b", N: 1}, tierlimit.Take{Key: "a", N: 2})
	if err != nil || r.Allowed || r.Source != tierlimit.SourceFallback {
		t.Fatalf("AllowAll(b 1, a 2) with b's fallback empty = %+v, %v; want a fallback denial", r, err)
	}
	if r, _ := l.AllowN(e.ctx, "a", 3); !r.Allowed {
		t.Errorf("AllowN(a, 3) after the refused AllowAll = %+v, want allowed: the refusal took nothing", r)
	}
	e.clock.Add(2 * time.Second)
	r, err = l.AllowAll(e.ctx, tierlimit.Take{Key: "b", N: 1}, tierlimit.Take{Key: "a", N: 2})
	if err != nil || !r.Allowed {
		t.Fatalf("AllowAll(b 1, a 2) with both full = %+v, %v; want allowed", r, err)
	}
	ea, _ := l.lookup("a")
	eb, _ := l.lookup("b")
	if got, want := ea.owed.Load()+eb.owed.Load(), int64(3+3+1+2); got != want {
		t.Errorf("owed %d after the fallback admitted 9 tokens, want %d", got, want)
	}
}

// TestStatsByLimit counts each key's decisions under its own limit, the
// default's being what the others leave, local decisions included.
func TestStatsByLimit(t *testing.T) {
	e := newEnv(t)
	pro := tierlimit.PerHour(50)
	l := e.limiter(t, tierlimit.PerHour(10), WithLimitFunc(func(key string) tierlimit.Limit {
		if strings.HasPrefix(key, "pro") {
			return pro
		}
		return tierlimit.Limit{}
	}))
	for i := 0; i < 60; i++ {
		if _, err := l.Allow(e.ctx, "pro1"); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(e.ctx, "free1"); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Stats()
	want := []LimitStats{
		{Limit: tierlimit.PerHour(10), Allowed: 10, Denied: 50},
		{Limit: pro, Allowed: 50, Denied: 10},
	}
	if fmt.Sprint(s.Limits) != fmt.Sprint(want) {
		t.Errorf("Stats.Limits = %+v, want %+v", s.Limits, want)
	}
	if s.Allowed != 60 || s.Denied != 60 {
		t.Errorf("Stats: %d allowed, %d denied; want 60, 60", s.Allowed, s.Denied)
	}
}

// TestWithLimits holds every key to two limits at once: the smaller burst
// binds, Redis charges both buckets, and the fallback shares the tightest.
func TestWithLimits(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100), WithLimits(tierlimit.PerHour(1000).WithBurst(30)))
	if _, err := l.AllowN(e.ctx, "k", 31); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("AllowN(31) over the smaller burst of 30 = %v, want ErrInvalidCost", err)
	}
	var admitted int64
	for i := 0; i < 100; i++ {
		r, err := l.Allow(e.ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 30 {
		t.Errorf("admitted %d, want 30 (the second limit's burst)", admitted)
	}
	if got, want := l.Stats().FallbackLimit, tierlimit.PerHour(100).WithBurst(30); got != want {
		t.Errorf("FallbackLimit = %v, want %v (the lower rate, the smaller burst)", got, want)
	}
	e.closeAndAudit(t, l, 30, map[string]int64{"k": 30})
	if _, err := New(e.rdb, tierlimit.PerHour(100), WithLimits(tierlimit.Limit{}), WithClock(e.clock)); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("New(WithLimits(zero Limit)) = %v, want ErrInvalidLimit", err)
	}
}

// TestPlanChangeOfABlockedKey upgrades a key Redis blocked for half an
// hour: the instance asks the LimitFunc again within a lease TTL, and the
// key gets the new rate, not the old block.
func TestPlanChangeOfABlockedKey(t *testing.T) {
	e := newEnv(t)
	var pro atomic.Bool
	l := e.limiter(t, tierlimit.PerHour(2), WithLimitFunc(func(string) tierlimit.Limit {
		if pro.Load() {
			return tierlimit.PerHour(3600)
		}
		return tierlimit.Limit{}
	}))
	if r, err := l.AllowN(e.ctx, "k", 2); err != nil || !r.Allowed {
		t.Fatalf("AllowN(2) = %+v, %v", r, err)
	}
	if r, _ := l.Allow(e.ctx, "k"); r.Allowed || r.RetryAfter < 20*time.Minute {
		t.Fatalf("Allow on the drained key = %+v, want denied for about 30 minutes", r)
	}
	pro.Store(true)
	e.step(DefaultLeaseTTL)
	// The claim tells Redis of the new limit: the time before it refilled
	// under the old one (nothing), the next token comes at the new rate.
	r, err := l.Allow(e.ctx, "k")
	// G2: at most the exact answer (1 s) plus a refill interval.
	if err != nil || r.Allowed || r.Limit != tierlimit.PerHour(3600) || r.RetryAfter > time.Second+DefaultRefillInterval {
		t.Fatalf("Allow a lease TTL after the upgrade = %+v, %v; want denied under 3600/1h for at most 1s + %v", r, err, DefaultRefillInterval)
	}
	e.step(r.RetryAfter)
	if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed {
		t.Errorf("Allow after the new RetryAfter = %+v, %v; want allowed", r, err)
	}
}

// TestAllowAllFallbackAboveShare: in an outage, a take above its key's
// fallback share but within its limit is denied, as AllowN denies it, not
// an error.
func TestAllowAllFallbackAboveShare(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10), WithFallback(tierlimit.PerSecond(3)))
	e.outage()
	for l.Stats().BreakerOpens == 0 {
		if _, err := l.Allow(e.ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Add(2 * time.Second)
	if r, err := l.AllowN(e.ctx, "b", 5); err != nil || r.Allowed {
		t.Fatalf("AllowN(b, 5) from a fallback of burst 3 = %+v, %v; want a denial", r, err)
	}
	r, err := l.AllowAll(e.ctx, tierlimit.Take{Key: "b", N: 5}, tierlimit.Take{Key: "a", N: 1})
	if err != nil || r.Allowed || r.Source != tierlimit.SourceFallback {
		t.Fatalf("AllowAll(b 5, a 1) from fallbacks of burst 3 = %+v, %v; want a fallback denial", r, err)
	}
}

// TestRefundAfterADowngrade: a key that leased under a large limit, then
// got a smaller one from its LimitFunc, gives its lease back at the
// janitor's refund like any other key: its lease may hold more than the
// new limit's capacity, which the bucket's ledger caps, not the refund's
// input check (that check once failed the whole batch: every key's
// refund in it counted lost).
func TestRefundAfterADowngrade(t *testing.T) {
	e := newEnv(t)
	var small atomic.Bool
	l := e.limiter(t, tierlimit.PerHour(1000), WithLeaseBounds(100, 100), WithLimitFunc(func(key string) tierlimit.Limit {
		if small.Load() && key == "k" {
			return tierlimit.PerHour(10)
		}
		return tierlimit.Limit{}
	}))
	for _, key := range []string{"k", "other"} {
		if r, err := l.Allow(e.ctx, key); err != nil || !r.Allowed {
			t.Fatalf("Allow(%s) = %+v, %v", key, r, err)
		}
	}
	small.Store(true)
	e.step(DefaultLeaseTTL) // k's entry asks its LimitFunc again: its lease is k's under 10/1h
	if lim, err := l.LimitFor("k"); err != nil || lim != tierlimit.PerHour(10) {
		t.Fatalf("LimitFor(k) after the downgrade = %v, %v; want 10/1h", lim, err)
	}
	if err := l.refundHeld(e.clock.Now(), true); err != nil {
		t.Fatalf("refund: %v", err)
	}
	st := l.Stats()
	if st.Lost != 0 || st.Held != 0 || st.Leased != st.Spent+st.Refunded {
		t.Errorf("after the refund: %+v; want nothing lost or held, leased = spent + refunded", st)
	}
}
