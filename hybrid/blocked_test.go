package hybrid

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestBlockedKey: a LimitFunc that answers tierlimit.Blocked for a
// suspended tenant denies each of the key's calls on every path (AllowN,
// AllowAll, WaitN, Settle, a peek) without a Redis call and without
// charging the other keys of an AllowAll; LimitFor says so. A key with a
// lease that is suspended stops spending within a lease TTL and its lease
// goes back to Redis; a key lifted from the block is admitted again within
// a lease TTL.
func TestBlockedKey(t *testing.T) {
	e := newEnv(t)
	var suspended atomic.Bool
	l := e.limiter(t, tierlimit.PerSecond(100), WithLimitFunc(func(key string) tierlimit.Limit {
		if key == "sus" || key == "hot" && suspended.Load() {
			return tierlimit.Blocked
		}
		return tierlimit.Limit{}
	}), WithHeartbeat(time.Minute)) // no beat among the counted calls
	isBarred := func(call string, r tierlimit.Result) {
		t.Helper()
		if r.Allowed || r.Limit != tierlimit.Blocked || r.Source != tierlimit.SourceBlocked || r.RetryAfter != 0 {
			t.Errorf("%s on a blocked key = %+v, want denied with Limit Blocked, Source blocked, RetryAfter 0", call, r)
		}
	}
	before := e.calls.Calls()
	for _, n := range []int64{1, 0, 1000} { // a cost above any burst too: the key takes nothing
		r, err := l.AllowN(e.ctx, "sus", n)
		if err != nil {
			t.Fatalf("AllowN(sus, %d) = %v", n, err)
		}
		isBarred("AllowN", r)
	}
	r, err := l.AllowAll(e.ctx, tierlimit.Take{Key: "ok", N: 5}, tierlimit.Take{Key: "sus", N: 1})
	if err != nil {
		t.Fatal(err)
	}
	isBarred("AllowAll", r)
	if r, err := l.Settle(e.ctx, "sus", 5, 1); err != nil {
		t.Fatal(err)
	} else {
		isBarred("Settle", r)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Hour)
	defer cancel()
	start := time.Now()
	r, err = l.WaitN(ctx, "sus", 1)
	if !errors.Is(err, tierlimit.ErrWaitDeadline) || time.Since(start) > time.Second {
		t.Errorf("WaitN on a blocked key = %v after %v, want ErrWaitDeadline at once", err, time.Since(start))
	}
	isBarred("WaitN", r)
	if got, err := l.LimitFor("sus"); err != nil || got != tierlimit.Blocked {
		t.Errorf("LimitFor(sus) = %v, %v; want Blocked", got, err)
	}
	if got, err := l.LimitFor("ok"); err != nil || got != tierlimit.PerSecond(100) {
		t.Errorf("LimitFor(ok) = %v, %v; want the default", got, err)
	}
	if n := e.calls.Calls() - before; n != 0 {
		t.Errorf("the blocked key's calls made %d Redis calls, want 0", n)
	}
	if got := e.level(t, l, "ok"); got != 100 {
		t.Errorf("Redis holds %d of ok after an AllowAll a blocked key denied, want 100 (nothing charged)", got)
	}

	// A key with a lease, then suspended.
	if r, err := l.AllowN(e.ctx, "hot", 10); err != nil || !r.Allowed {
		t.Fatalf("AllowN(hot, 10) = %+v, %v", r, err)
	}
	admitted := int64(10)
	suspended.Store(true)
	e.step(DefaultLeaseTTL) // the answer the entry holds is a lease TTL old
	// What is left of the lease may be spent; its claim asks again, and
	// so does a refill.
	for i := 0; ; i++ {
		r, err := l.AllowN(e.ctx, "hot", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			isBarred("AllowN after the suspension", r)
			break
		}
		if admitted++; i == 100 {
			t.Fatalf("%d admitted after the suspension, want at most a lease", i)
		}
	}
	// The first call's lease ran low and queued a refill, which may have
	// claimed before the suspension (and the key's first call after it
	// spent it), or found the key barred: let it land before the refund.
	refilled(t, l)
	if err := l.refundHeld(e.clock.Now(), false); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Held != 0 || st.Lost != 0 || st.Leased != st.Spent+st.Refunded || st.Spent != admitted {
		t.Errorf("after the suspended key's refund: %+v; want nothing held or lost, leased = spent + refunded, spent = %d admitted (the lease went back)", st, admitted)
	}
	// Redis holds at most a full bucket (the one-bucket answer after a
	// lease TTL), at least 100 - admitted: until its deadline, the ledger's
	// record of the first claim caps the refill at what the key had left,
	// unless a later claim (the refill's) lowered it.
	if got := e.level(t, l, "hot"); got < 100-admitted || got > 100 {
		t.Errorf("Redis holds %d of hot after its suspension, want %d..100", got, 100-admitted)
	}
	suspended.Store(false)
	e.step(DefaultLeaseTTL)
	if r, err := l.AllowN(e.ctx, "hot", 1); err != nil || !r.Allowed || r.Limit != tierlimit.PerSecond(100) {
		t.Errorf("AllowN(hot) a lease TTL after the block was lifted = %+v, %v; want allowed", r, err)
	}
}

// TestLimitLookup: a failing LimitLookup fails closed, with no Redis call
// for the key, or open to the default with WithLookupFailOpen
// (tenanttest.CheckLookupFails and CheckLookupFailsOpen); a failure is not
// remembered: the key's next call asks again.
func TestLimitLookup(t *testing.T) {
	e := newEnv(t)
	var lk tenanttest.Lookup
	var asks atomic.Int64
	lookup := func(key string) (tierlimit.Limit, error) {
		asks.Add(1)
		return lk.Limit(key)
	}
	closed := e.limiter(t, tenanttest.Default, WithLimitLookup(lookup), WithPrefix("closed:"), WithHeartbeat(time.Minute))
	tenanttest.CheckLookupFails(t, closed, &lk, "down", "up")
	lk.Down.Store(true)
	before, asked := e.calls.Calls(), asks.Load()
	for i := range 3 {
		if _, err := closed.AllowN(e.ctx, "down:again", 1); !errors.Is(err, tierlimit.ErrLimitLookup) {
			t.Fatalf("call %d: AllowN(down:again, 1) = %v, want ErrLimitLookup", i, err)
		}
	}
	if got := asks.Load() - asked; got != 3 {
		t.Errorf("3 calls with the lookup down asked it %d times, want 3 (a failure is not remembered)", got)
	}
	if got := e.calls.Calls() - before; got != 0 {
		t.Errorf("calls whose lookup failed made %d Redis calls, want 0", got)
	}
	lk.Down.Store(false)
	open := e.limiter(t, tenanttest.Default, WithLimitLookup(lk.Limit), WithLookupFailOpen(), WithPrefix("open:"))
	tenanttest.CheckLookupFailsOpen(t, open, &lk, "down", tenanttest.Default)
}
