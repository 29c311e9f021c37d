package remote

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestTenantsRandom drives every algorithm with random calls (AllowN,
// Settle, AllowAll with another key, AllowAtMost) while the key's LimitFunc answer
// changes at random and the clock steps forward, and now and then back (a
// client clock behind another's). Every Result must be consistent: a peek
// allowed, a denial with a RetryAfter (an admission without),
// Remaining within [0, capacity] of the limit that decided. A peek is
// allowed but on a bucket in debt (TokenBucket, GCRA: Settle's overruns).
func TestTenantsRandom(t *testing.T) {
	ctx := context.Background()
	limits := []tierlimit.Limit{
		{Rate: 26, Period: time.Microsecond}, {Rate: 40, Period: 3 * time.Microsecond},
		{Rate: 3, Period: 2 * time.Microsecond}, {Rate: 7, Period: 50 * time.Microsecond}, tierlimit.PerSecond(30),
	}
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			rng := rand.New(rand.NewPCG(7, 8))
			var cur tierlimit.Limit
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(1000), WithLimitFunc(func(string) tierlimit.Limit { return cur }))
			now := t0
			for step := range 1500 {
				cur = limits[rng.IntN(len(limits))]
				now = now.Add(time.Duration(rng.IntN(5)) * time.Microsecond)
				if rng.IntN(30) == 0 {
					now = now.Add(-time.Duration(rng.IntN(100)) * time.Microsecond)
				}
				m.SetTime(now)
				n := int64(rng.IntN(4))
				var r tierlimit.Result
				var err error
				call := rng.IntN(5)
				var granted int64
				switch call {
				case 0, 1:
					r, err = l.AllowN(ctx, "k", n)
				case 2:
					r, err = l.Settle(ctx, "k", n, rng.Int64N(cur.Rate+1))
				case 3:
					r, err = l.AllowAll(ctx, tierlimit.Take{Key: "k", N: n}, tierlimit.Take{Key: "o", N: 1})
				case 4:
					granted, r, err = l.(budget).AllowAtMost(ctx, "k", 1+n*n)
					if err != nil || granted < 0 || granted > min(1+n*n, cur.Rate) || r.Allowed != (granted > 0) {
						t.Fatalf("step %d: AllowAtMost(%d) under %v = %d, %+v, %v", step, 1+n*n, cur, granted, r, err)
					}
					continue
				}
				if n > cur.Rate {
					if err == nil {
						t.Fatalf("step %d: cost %d above %v: no error", step, n, cur)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				switch {
				case r.Allowed != (r.RetryAfter == 0),
					r.Remaining < 0 || r.Remaining > r.Limit.Capacity(),
					n == 0 && call < 2 && !r.Allowed && alg.windowed:
					t.Fatalf("step %d, call %d of cost %d under %v: %+v", step, call, n, cur, r)
				}
			}
		})
	}
}
