package hybrid

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestSettle charges estimates and settles them, through the lease and
// through Redis, and checks that Redis ends holding exactly capacity minus
// what was really used.
func TestSettle(t *testing.T) {
	tests := []struct {
		name          string
		charged, used int64
		expire        bool  // the lease expires between the charge and the settle
		wantCalls     int64 // Redis calls Settle makes
	}{
		{name: "give back to the lease", charged: 10, used: 4},
		{name: "take more from the lease", charged: 4, used: 10},
		{name: "give back to Redis", charged: 10, used: 4, expire: true, wantCalls: 1}, // the lease went back to Redis
		{name: "take more from Redis", charged: 4, used: 10, expire: true, wantCalls: 1},
		{name: "exact", charged: 7, used: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			// Leases of 30 tokens out of 100, which refill in an hour:
			// the lease TTL refills none. No charge here leaves half a
			// lease, which would queue a background refill.
			l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(30, 30))
			if r, err := l.AllowN(e.ctx, "k", tt.charged); err != nil || !r.Allowed {
				t.Fatalf("AllowN(k, %d) = %+v, %v; want allowed", tt.charged, r, err)
			}
			if tt.expire {
				// The janitor's round after the lease's TTL: within a
				// quarter TTL, before the ledger's record of the lease
				// passes its deadline (leaseHold), after which a refund
				// gives none of the lease's tokens back.
				e.step(DefaultLeaseTTL + DefaultLeaseTTL/4)
				if err := l.refundHeld(e.clock.Now(), false); err != nil {
					t.Fatal(err)
				}
			}
			before := e.calls.Calls()
			r, err := l.Settle(e.ctx, "k", tt.charged, tt.used)
			if err != nil || !r.Allowed {
				t.Fatalf("Settle(k, %d, %d) = %+v, %v; want allowed", tt.charged, tt.used, r, err)
			}
			if got := e.calls.Calls() - before; got != tt.wantCalls {
				t.Errorf("Settle made %d Redis calls, want %d", got, tt.wantCalls)
			}
			e.closeAndAudit(t, l, tt.used, map[string]int64{"k": tt.used})
		})
	}
}

// TestSettleGiveBackPastTheLease gives back more than the key's last lease
// while the lease still holds tokens: the give-back goes to Redis with the
// lease, and the bucket's ledger does not cap it at what the lease's record
// counted (ExampleLimiter_Settle gave back nothing in a CI run where the
// entry had left the cache).
func TestSettleGiveBackPastTheLease(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(20, 20))
	for range 3 { // leases of 20, 30 spent, 30 left in the lease (refilled at half)
		if r, err := l.AllowN(e.ctx, "k", 10); err != nil || !r.Allowed {
			t.Fatalf("AllowN(k, 10) = %+v, %v; want allowed", r, err)
		}
		refilled(t, l)
	}
	before := e.calls.Calls()
	r, err := l.Settle(e.ctx, "k", 30, 4) // 26 back: more than a lease
	if err != nil || !r.Allowed || r.Remaining != 96 {
		t.Fatalf("Settle(k, 30, 4) = %+v, %v; want allowed, 96 remaining (100 - 4 used)", r, err)
	}
	if got := e.calls.Calls() - before; got != 1 {
		t.Errorf("Settle made %d Redis calls, want 1", got)
	}
	if got := l.Stats().Held; got != 0 {
		t.Errorf("Held after a give-back to Redis = %d, want 0 (the lease went with it)", got)
	}
	e.closeAndAudit(t, l, 4, map[string]int64{"k": 4})
}

// TestSettleDebt takes more than the bucket holds: the rest is debt, down
// to minus the capacity, and the key is denied, with a RetryAfter that
// counts the debt (at least the exact one-bucket answer, at most a refill
// interval more: G2), until the rate has repaid it.
func TestSettleDebt(t *testing.T) {
	tests := []struct {
		name      string
		settles   [][2]int64 // charged, used
		wantLevel int64      // after the settles: the bucket's level, 10 before them
	}{
		{name: "into debt", settles: [][2]int64{{10, 60}}, wantLevel: -40},
		{name: "exactly empty", settles: [][2]int64{{0, 10}}, wantLevel: 0},
		{name: "the floor is minus the capacity", settles: [][2]int64{{10, 60}, {0, 100}}, wantLevel: -100},
		{name: "a give-back repays", settles: [][2]int64{{10, 60}, {30, 0}}, wantLevel: -10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			lim := tierlimit.PerSecond(100)
			l := e.limiter(t, lim, WithLeaseBounds(1, 20))
			if r, err := l.AllowN(e.ctx, "k", 90); err != nil || !r.Allowed {
				t.Fatalf("AllowN(k, 90) = %+v, %v", r, err)
			}
			for _, st := range tt.settles {
				r, err := l.Settle(e.ctx, "k", st[0], st[1])
				if err != nil || !r.Allowed || r.Remaining < 0 {
					t.Fatalf("Settle(k, %d, %d) = %+v, %v; want allowed, Remaining >= 0", st[0], st[1], r, err)
				}
			}
			// A background refill that AllowN(90) started may still be in
			// flight: its reply, landing after the clock below moved, would
			// count its RetryAfter from then (apply), which a real Redis's
			// milliseconds make nothing of and a step of the clock makes
			// hundreds of ms (once in 30 runs under -race).
			if en, ok := l.lookup("k"); ok {
				waitFor(t, "the key's refill", func() bool { return en.refillDone.Load() == nil })
			}
			// A caller alone on the key, waiting each RetryAfter it is told:
			// denied until the level is back to 1 (at repaid), each time
			// with a RetryAfter of at least what the level lacks, at most a
			// refill interval more (G2), and admitted once it has waited.
			repaid := lim.RefillTime(1 - tt.wantLevel)
			var waited time.Duration
			for i := 0; ; i++ {
				r, err := l.Allow(e.ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed {
					if waited < repaid {
						t.Fatalf("admitted %v after the settles, before the debt was repaid at %v", waited, repaid)
					}
					break
				}
				exact := max(repaid-waited, 0)
				if r.RetryAfter <= 0 || r.RetryAfter < exact || r.RetryAfter > exact+DefaultRefillInterval || i == 5 {
					t.Fatalf("denial %d, %v after the settles: Allow = %+v; want RetryAfter in [%v, %v], admitted within 5 waits",
						i, waited, r, exact, exact+DefaultRefillInterval)
				}
				e.step(r.RetryAfter)
				waited += r.RetryAfter
			}
		})
	}
}

// TestSettleDebtPeek: a peek at a key in debt is denied, with the wait
// until the debt is repaid, and charges nothing.
func TestSettleDebtPeek(t *testing.T) {
	e := newEnv(t)
	lim := tierlimit.PerSecond(100)
	l := e.limiter(t, lim, WithLeaseBounds(1, 20))
	if _, err := l.Settle(e.ctx, "k", 0, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Settle(e.ctx, "k", 0, 30); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := l.AllowN(e.ctx, "k", 0)
		if err != nil || r.Allowed || r.RetryAfter != lim.RefillTime(30) || r.Remaining != 0 {
			t.Fatalf("AllowN(k, 0) in a debt of 30 = %+v, %v; want denied, RetryAfter %v, Remaining 0",
				r, err, lim.RefillTime(30))
		}
	}
}

// TestWaitN drains a 10/s key on a real Redis, with default options: a
// waiter is admitted within about one token's refill, and a deadline that
// cannot be met fails at once.
func TestWaitN(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	l, err := New(rdb, tierlimit.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if _, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	r, err := l.WaitN(ctx, "k", 1)
	if err != nil || !r.Allowed {
		t.Fatalf("WaitN = %+v, %v; want allowed", r, err)
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("WaitN on a drained 10/s key took %v, want about 100ms", d)
	}

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start = time.Now()
	r, err = l.WaitN(short, "k", 5) // 5 tokens: 500 ms away
	if !errors.Is(err, tierlimit.ErrWaitDeadline) || r.Allowed {
		t.Fatalf("WaitN(5) with 20ms left = %+v, %v; want ErrWaitDeadline", r, err)
	}
	if d := time.Since(start); d > 15*time.Millisecond {
		t.Errorf("WaitN took %v to see the deadline, want at once", d)
	}
}

// TestGiveBackCoveredByTheRecord gives spent tokens back after a denied
// claim lowered the lease's ledger record to what the lease held: Redis's
// ceiling rose by the tokens the record no longer counts, so a give-back
// into the lease would have them twice, in the lease and in the bucket. At
// the instant after it the fleet admits at most the capacity, as one
// bucket would.
func TestGiveBackCoveredByTheRecord(t *testing.T) {
	e := newEnv(t)
	limit := tierlimit.PerSecond(100).WithBurst(10)
	a := e.limiter(t, limit, WithLeaseBounds(6, 6))
	c := e.limiter(t, limit, WithLeaseBounds(4, 4))
	for _, x := range []struct {
		l    *Limiter
		n    int64
		want bool
	}{
		{a, 2, true},  // a leases 6, spends 2: 4 left, no refill
		{c, 4, true},  // c drains Redis
		{a, 5, false}, // a's claim of 1 more is denied: a's record falls to the 4 a holds
	} {
		if r, err := x.l.AllowN(e.ctx, "k", x.n); err != nil || r.Allowed != x.want {
			t.Fatalf("AllowN(k, %d) = %+v, %v; want allowed %v", x.n, r, err, x.want)
		}
		refilled(t, x.l)
		if x.l == c {
			if err := c.Close(); err != nil { // c's record ends: the ceiling is capacity less a's
				t.Fatal(err)
			}
		}
	}
	// Past the denial's wait, within the lease's TTL: the bucket refills
	// up to its ceiling, capacity less a's record.
	e.step(70 * time.Millisecond)
	if r, err := a.Settle(e.ctx, "k", 2, 0); err != nil || !r.Allowed {
		t.Fatalf("Settle(k, 2, 0) = %+v, %v; want allowed", r, err)
	}
	var admitted int64
	for admitted <= 2*limit.Capacity() {
		r, err := a.AllowN(e.ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			break
		}
		admitted++
	}
	if admitted > limit.Capacity() {
		t.Errorf("admitted %d at one instant after the give-back, over the capacity %d", admitted, limit.Capacity())
	}
}

// TestSettleAboveBurst: Settle accepts a used above the key's Burst,
// takes from the lease, then from Redis into debt down to minus the
// Burst, and reports what the floor cut off as Result.Uncharged (the
// script is sent at most twice the capacity; the rest is uncharged
// without a look); a negative used, or a charged above the Burst, is
// ErrInvalidCost. At one frozen instant on miniredis, as the root
// package's TestSettleAboveBurst for the other tiers.
func TestSettleAboveBurst(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(10))
	for i, s := range []struct {
		reset         bool
		charged, used int64
		want          int64 // Uncharged
		level         int64 // Redis's level after, as a plain bucket reads it (0 in debt)
	}{
		{used: 25, want: 5},              // full: 10 then 10 into debt, 5 cut
		{used: 3, want: 3},               // at the floor
		{charged: 3, used: 3},            // nothing to correct
		{reset: true, used: 12, want: 0}, // 10 then 2 into debt
		{reset: true, used: math.MaxInt64, want: math.MaxInt64 - 20},
	} {
		if s.reset {
			if err := l.Reset(e.ctx, "u"); err != nil {
				t.Fatal(err)
			}
		}
		r, err := l.Settle(e.ctx, "u", s.charged, s.used)
		if err != nil || !r.Allowed || r.Uncharged != s.want {
			t.Errorf("step %d: Settle(%d, %d) = %+v, %v; want allowed, Uncharged %d", i, s.charged, s.used, r, err, s.want)
		}
		if got := e.level(t, l, "u"); got != s.level {
			t.Errorf("step %d: Redis holds %d after Settle(%d, %d), want %d", i, got, s.charged, s.used, s.level)
		}
	}
	for _, c := range [][2]int64{{0, -1}, {11, 11}, {-1, 0}} {
		if _, err := l.Settle(e.ctx, "u", c[0], c[1]); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("Settle(%d, %d) = %v, want ErrInvalidCost", c[0], c[1], err)
		}
	}
}
