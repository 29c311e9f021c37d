package local

import (
	"context"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestBlocked: a key the LimitFunc blocks is denied by every call, peeks
// included, with the blocked Result, and never charged: a refused AllowAll
// charges its other keys nothing, WaitN returns at once with
// ErrWaitDeadline, Settle changes nothing, and the key's tokens are as
// they were when the function opens it again.
func TestBlocked(t *testing.T) {
	p := newPlans("t", tierlimit.PerSecond(10))
	l, _ := newTest(t, tierlimit.PerSecond(5), WithLimitFunc(p.limit))
	ctx := context.Background()
	if r, err := l.AllowN(ctx, "t", 4); err != nil || !r.Allowed {
		t.Fatalf("AllowN(t, 4) = %+v, %v; want allowed", r, err)
	}
	p.set("t", tierlimit.Blocked)
	tenanttest.CheckBlocked(t, l, "t", "ok")
	p.set("t", tierlimit.PerSecond(10))
	if r, _ := l.AllowN(ctx, "t", 0); r.Remaining != 6 {
		t.Errorf("unblocked: Remaining = %d, want 6 (4 taken before the block, nothing since)", r.Remaining)
	}
}

// TestLimitFor: tenanttest.CheckLimitFor.
func TestLimitFor(t *testing.T) {
	with, _ := newTest(t, tenanttest.Default, WithLimitFunc(tenanttest.Plans))
	without, _ := newTest(t, tenanttest.Default)
	tenanttest.CheckLimitFor(t, with, without)
}

// TestLimitLookup: a failing LimitLookup fails closed, or open to the
// default with WithLookupFailOpen (tenanttest.CheckLookupFails and
// CheckLookupFailsOpen).
func TestLimitLookup(t *testing.T) {
	var lk tenanttest.Lookup
	closed, _ := newTest(t, tenanttest.Default, WithLimitLookup(lk.Limit))
	tenanttest.CheckLookupFails(t, closed, &lk, "down", "up")
	open, _ := newTest(t, tenanttest.Default, WithLimitLookup(lk.Limit), WithLookupFailOpen())
	tenanttest.CheckLookupFailsOpen(t, open, &lk, "down", tenanttest.Default)
}
