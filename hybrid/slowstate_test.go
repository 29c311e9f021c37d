package hybrid

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// latencyHook steps an env's clock by d at every round trip: Redis answers
// d after each call, on the limiter's clock.
type latencyHook struct {
	e *env
	d time.Duration
}

func (h latencyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h latencyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.e.step(h.d)
		return err
	}
}

func (h latencyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.e.step(h.d)
		return err
	}
}

// TestManyKeysInTurnLeaveTheSlowState is the slow state of issue 28: one
// caller asks many keys in turn, and each claim takes 3 ms of the clock, so
// the first pass over 500 keys takes 1.5 s and each key is asked once per
// 1.5 s, less than twice per lease TTL. Sized on that demand, every lease
// would be one token and every decision would claim, each pass as slow as
// the first. The time the caller waited on its claims is not time in which
// it could ask: the second pass leases each key a floor lease, and the
// passes after it decide in process.
func TestManyKeysInTurnLeaveTheSlowState(t *testing.T) {
	const keys, passes = 500, 8
	e := newEnv(t)
	e.rdb.AddHook(latencyHook{e, 3 * time.Millisecond})
	limit := tierlimit.PerSecond(1000) // leases up to 100, a floor of 25
	l := e.limiter(t, limit)
	remote := make([]int64, passes)
	for pass := range passes {
		before := l.Stats().Remote
		for k := range keys {
			if r, err := l.Allow(e.ctx, fmt.Sprint("k", k)); err != nil || !r.Allowed {
				t.Fatalf("pass %d, key %d: %+v, %v", pass, k, r, err)
			}
		}
		remote[pass] = l.Stats().Remote - before
	}
	t.Logf("decisions that claimed, per pass of %d keys: %v", keys, remote)
	if remote[0] != keys {
		t.Errorf("pass 0: %d decisions claimed, want %d (every key is new)", remote[0], keys)
	}
	for pass := 2; pass < passes; pass++ {
		if remote[pass] != 0 {
			t.Errorf("pass %d: %d decisions claimed, want 0: the keys' leases stay one token (the slow state)", pass, remote[pass])
		}
	}
	// One token, then a floor lease per key; the janitor's rounds (real
	// time) may renew some leases on top (CI under -race: 69 tokens more).
	s := l.Stats()
	if want := int64(keys) * (1 + limit.Capacity()/DefaultLeaseShare/leaseFloorShare); s.Leased < want {
		t.Errorf("leased %d tokens, want at least %d: one, then a floor lease per key", s.Leased, want)
	}
}

// TestSteadyKeyRenewsItsLease: a key asked steadily, whose lease outlasts
// its TTL, keeps it: the janitor's round before the expiry renews it in
// the background, where it would refund it and the key's next caller would
// claim and wait. A key asked too rarely to be steady is left to expire.
func TestSteadyKeyRenewsItsLease(t *testing.T) {
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name       string
		every      time.Duration // between two asks of the key
		wantRemote bool          // a decision after the first claims
	}{
		{"steady", 100 * time.Millisecond, false},
		{"rare", 1500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			l := e.limiter(t, tierlimit.PerSecond(1000), WithLeaseTTL(ttl), WithLeaseBounds(50, 100))
			var claimed int64
			for i := range int(3 * ttl / tc.every) {
				if r, err := l.Allow(e.ctx, "k"); err != nil || !r.Allowed {
					t.Fatalf("ask %d: %+v, %v", i, r, err)
				}
				if i == 0 {
					claimed = l.Stats().Remote
				}
				e.step(tc.every)
				l.sweep() // the janitor's round, at the clock of the test
			}
			s := l.Stats()
			if got := s.Remote > claimed; got != tc.wantRemote {
				t.Errorf("%d decisions claimed after the first: want claims %v (stats %+v)", s.Remote-claimed, tc.wantRemote, s)
			}
			checkLedger(t, s, int64(3*ttl/tc.every))
		})
	}
}

// TestBlockEndClaimedInBackground: a denial of a blocked key close to the
// block's end (preclaim) claims the key's next lease in
// the background, so that the first caller after the block decides in
// process instead of waiting for a claim; and that lease is what Redis
// accrued, not one token (the demand of a blocked key is not counted).
func TestBlockEndClaimedInBackground(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(100)) // leases up to 10
	for i := 0; ; i++ {
		r, err := l.Allow(e.ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			break
		}
		if i > 200 {
			t.Fatal("never denied")
		}
	}
	ent, ok := l.lookup("k")
	if !ok {
		t.Fatal("no entry")
	}
	until, lead := ent.blockedUntil.Load(), l.preclaim(ent)
	if until == 0 || lead <= 0 {
		t.Fatalf("blocked until %d, preclaim %v: want both set", until, time.Duration(lead))
	}
	// Within the lead before the block's end: the lead is what the
	// limiter measured of a round trip to miniredis (at least an eighth
	// of the block, at most half a refill interval), however loaded the
	// machine; the test's clock steps, so the claim's real time is not
	// the question. At most a tenth of the block, so that what Redis
	// accrued by then is most of a lease.
	ahead := min(lead/2, (until-ent.lastClaim.Load())/10)
	e.step(time.Duration(until - ahead - l.now()))
	if r, err := l.Allow(e.ctx, "k"); err != nil || r.Allowed || r.Source != tierlimit.SourceBlocked {
		t.Fatalf("close to the block's end: %+v, %v; want denied in process", r, err)
	}
	refilled(t, l)
	if ent.blockedUntil.Load() == until {
		t.Fatal("no background claim landed")
	}
	calls := e.calls.Calls()
	e.step(time.Duration(until - l.now()))
	r, err := l.Allow(e.ctx, "k")
	if err != nil || !r.Allowed || r.Source != tierlimit.SourceLocal {
		t.Errorf("at the block's end: %+v, %v; want allowed in process", r, err)
	}
	if got := e.calls.Calls() - calls; got != 0 {
		t.Errorf("at the block's end: %d Redis calls, want 0", got)
	}
	if got := ent.lastSize.Load(); got < 5 {
		t.Errorf("the lease claimed at the block's end holds %d tokens, want what Redis accrued (8 or more of 10)", got)
	}
}
