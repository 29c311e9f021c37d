package hybrid

import (
	"context"
	"errors"
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
			// Leases of 20 tokens out of 100, which refill in an hour:
			// the lease TTL refills none.
			l := e.limiter(t, tierlimit.PerHour(100), WithLeaseBounds(20, 20))
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
	for range 3 { // claims of 20, 20 spent, 10 left in the lease
		if r, err := l.AllowN(e.ctx, "k", 10); err != nil || !r.Allowed {
			t.Fatalf("AllowN(k, 10) = %+v, %v; want allowed", r, err)
		}
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

// TestSettleNeverBelowEmpty takes more than the bucket holds: it empties,
// and Settle is not denied.
func TestSettleNeverBelowEmpty(t *testing.T) {
	e := newEnv(t)
	l := e.limiter(t, tierlimit.PerSecond(100), WithLeaseBounds(1, 20))
	if r, err := l.AllowN(e.ctx, "k", 90); err != nil || !r.Allowed {
		t.Fatalf("AllowN(k, 90) = %+v, %v", r, err)
	}
	r, err := l.Settle(e.ctx, "k", 10, 60) // 50 more, of the 10 left
	if err != nil || !r.Allowed {
		t.Fatalf("Settle = %+v, %v; want allowed", r, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	plain := e.limiter(t, l.limit, WithMaxKeys(16))
	if got := e.level(t, plain, "k"); got != 0 {
		t.Errorf("Redis holds %d after settling past empty, want 0", got)
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
