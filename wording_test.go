package tierlimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// costMisuser is what every rate limiter in Redis offers to misuse a cost.
type costMisuser interface {
	AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
}

// TestCostWordingAcrossTiers: a cost outside a key's capacity is one
// error in one wording on every tier in Redis, hybrid's: after the
// package's name, `tierlimit: invalid cost: key "k": n 100 must be
// between 0 and 10`, naming the key. (A used above the capacity is no
// misuse on remote: Settle charges what it can and reports the rest as
// Result.Uncharged; TestSettleAboveBurst.)
func TestCostWordingAcrossTiers(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	limit := tierlimit.PerSecond(10)
	h, err := hybrid.New(rdb, limit, hybrid.WithPrefix("wording-hybrid:"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	misuses := []struct {
		name string
		call func(costMisuser) error
	}{
		{"AllowN(k, 100)", func(l costMisuser) error { _, err := l.AllowN(ctx, "k", 100); return err }},
		{"AllowN(k, -1)", func(l costMisuser) error { _, err := l.AllowN(ctx, "k", -1); return err }},
		{"WaitN(k, 100)", func(l costMisuser) error { _, err := l.WaitN(ctx, "k", 100); return err }},
		{"Settle(k, 100, 0)", func(l costMisuser) error { _, err := l.Settle(ctx, "k", 100, 0); return err }},
	}
	for _, tier := range tiers {
		if !tier.redis || tier.name == "hybrid" {
			continue
		}
		l, err := tier.new(rdb, limit, tierOptions{prefix: "wording-" + strings.ReplaceAll(tier.name, " ", "-") + ":"})
		if err != nil {
			t.Fatal(err)
		}
		r, ok := l.(unclosable).remoteLimiter.(costMisuser)
		if !ok {
			t.Fatalf("%s: %T has no AllowN, WaitN and Settle", tier.name, l)
		}
		for _, m := range misuses {
			want := m.call(h)
			got := m.call(r)
			if !errors.Is(got, tierlimit.ErrInvalidCost) {
				t.Errorf("%s: %s = %v, want an error wrapping ErrInvalidCost", tier.name, m.name, got)
				continue
			}
			if g, w := strings.TrimPrefix(got.Error(), "remote: "), strings.TrimPrefix(want.Error(), "hybrid: "); g != w {
				t.Errorf("%s: %s = %q, want %q as hybrid's", tier.name, m.name, g, w)
			}
		}
	}
}
