package tenanttest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tierlimit/tierlimit"
)

// ErrPlansDown is the error of Lookup's failures.
var ErrPlansDown = errors.New("plan store unreachable")

// Lookup is a LimitLookup that answers Pro for every key, but fails
// with ErrPlansDown for the keys beginning with "down" while Down is set.
type Lookup struct {
	Down atomic.Bool
}

// Limit is the LimitLookup.
func (lk *Lookup) Limit(key string) (tierlimit.Limit, error) {
	if lk.Down.Load() && len(key) >= 4 && key[:4] == "down" {
		return tierlimit.Limit{}, ErrPlansDown
	}
	return Pro, nil
}

// CheckLookupFails checks l, built with lk.Limit as its LimitLookup
// (failing closed), while lk is down: every call for key ("down…") returns
// an error wrapping tierlimit.ErrLimitLookup and ErrPlansDown and a
// Result that is not Allowed, without a RetryAfter; an AllowAll of other
// (whose lookup answers) and key charges other nothing; and once lk is
// back, key was charged nothing either.
func CheckLookupFails(t *testing.T, l Tenant, lk *Lookup, key, other string) {
	t.Helper()
	ctx := context.Background()
	before, err := l.AllowN(ctx, other, 0)
	if err != nil {
		t.Fatalf("AllowN(%q, 0) = %v", other, err)
	}
	lk.Down.Store(true)
	calls := []struct {
		name string
		call func() (tierlimit.Result, error)
	}{
		{"AllowN(key, 1)", func() (tierlimit.Result, error) { return l.AllowN(ctx, key, 1) }},
		{"AllowN(key, 0)", func() (tierlimit.Result, error) { return l.AllowN(ctx, key, 0) }},
		{"AllowAll(other 1, key 1)", func() (tierlimit.Result, error) {
			return l.AllowAll(ctx, tierlimit.Take{Key: other, N: 1}, tierlimit.Take{Key: key, N: 1})
		}},
		{"WaitN(key, 1)", func() (tierlimit.Result, error) { return l.WaitN(ctx, key, 1) }},
		{"Settle(key, 0, 4)", func() (tierlimit.Result, error) { return l.Settle(ctx, key, 0, 4) }},
		{"AllowAtMost(key, 3)", func() (tierlimit.Result, error) {
			granted, res, err := l.AllowAtMost(ctx, key, 3)
			if granted != 0 {
				return res, fmt.Errorf("granted %d, want 0: %w", granted, err)
			}
			return res, err
		}},
		{"LimitFor(key)", func() (tierlimit.Result, error) {
			lim, err := l.LimitFor(key)
			return tierlimit.Result{Limit: lim}, err
		}},
	}
	for _, c := range calls {
		got, err := c.call()
		if !errors.Is(err, tierlimit.ErrLimitLookup) || !errors.Is(err, ErrPlansDown) {
			t.Errorf("%s with the lookup down: error %v, want one wrapping ErrLimitLookup and the lookup's error", c.name, err)
		}
		if got.Allowed || got.RetryAfter != 0 || got.Limit != (tierlimit.Limit{}) {
			t.Errorf("%s with the lookup down = %+v, want not Allowed, no RetryAfter, no Limit", c.name, got)
		}
	}
	lk.Down.Store(false)
	if after, err := l.AllowN(ctx, other, 0); err != nil || after.Remaining != before.Remaining {
		t.Errorf("the other key of a failed AllowAll: Remaining = %d (%v), got %d before; want it not charged",
			after.Remaining, err, before.Remaining)
	}
	if got, err := l.AllowN(ctx, key, 0); err != nil || got.Remaining != Pro.Capacity() || got.Limit != Pro {
		t.Errorf("the key once its lookup answers: AllowN(key, 0) = %+v, %v; want Remaining %d under %v (nothing charged)",
			got, err, Pro.Capacity(), Pro)
	}
}

// CheckLookupFailsOpen checks l, a limiter of def built with lk.Limit as
// its LimitLookup and WithLookupFailOpen, while lk is down: key ("down…")
// is decided under def, with no error.
func CheckLookupFailsOpen(t *testing.T, l Tenant, lk *Lookup, key string, def tierlimit.Limit) {
	t.Helper()
	ctx := context.Background()
	lk.Down.Store(true)
	defer lk.Down.Store(false)
	if got, err := l.LimitFor(key); got != def || err != nil {
		t.Errorf("LimitFor(key) with the lookup down = %v, %v; want the default %v, nil", got, err, def)
	}
	got, err := l.AllowN(ctx, key, 1)
	if err != nil || !got.Allowed || got.Limit != def {
		t.Errorf("AllowN(key, 1) with the lookup down = %+v, %v; want allowed under the default %v", got, err, def)
	}
	if _, err := l.AllowN(ctx, key, def.Capacity()+1); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("AllowN(key, %d) with the lookup down: error %v, want ErrInvalidCost (the default's burst applies)",
			def.Capacity()+1, err)
	}
}
