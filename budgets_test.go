package tierlimit_test

// Budgets (issue 30): debt and partial grants, across a fleet of processes
// and on every tier.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// overrun is how much each request of the debt tests uses beyond its
// estimate: half of it (cost 4, used 6).
const (
	overrunCost = 4
	overrunUsed = overrunCost * 3 / 2
)

// TestFleetDebt is G1 restated for tokens used: three processes with 8
// goroutines each, every request charged its estimate and settled at 1.5
// times it, for 10 s, with default options and go-redis's default client,
// on an idle machine and beside a busy loop. The tokens used stay within
// one bucket plus one overrun per caller (a request admitted just before
// the interval ends settles after it), where a Settle that stops at empty
// would let the fleet use 1.5 buckets; and the fleet uses at least 85% of
// the bucket (the debt does not starve it).
func TestFleetDebt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 10 s fleets")
	}
	const goroutines = 1
	spec := memberSpec{Limit: tierlimit.PerSecond(200), Keys: 1, Prefix: "debt:", Goroutines: goroutines,
		Duration: 10 * time.Second, Mode: "overrun", Cost: overrunCost}
	eachLoad(t, spec, func(t *testing.T, reports []memberReport, total map[string]int64, bound int64, _ func(string) int64) {
		used := total["hot"]
		limit := bound + 3*goroutines*(overrunUsed-overrunCost)
		t.Logf("fleet used %d tokens; one bucket over the run %d, with one overrun per caller %d", used, bound, limit)
		if used > limit {
			t.Errorf("used %d tokens > one bucket %d plus an overrun per caller (%d)", used, bound, limit)
		}
		if used < bound*85/100 {
			t.Errorf("used %d tokens < 85%% of one bucket's %d", used, bound)
		}
	})
}

// TestFleetAllowAtMost: three processes with 8 goroutines each take one
// key with AllowAtMost(7) for 3 s, with default options and go-redis's
// default client, on an idle machine and beside a busy loop: they are
// granted at most what one bucket holds over the run, and at least 90% of
// it.
func TestFleetAllowAtMost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 3 s fleets")
	}
	spec := memberSpec{Limit: tierlimit.PerSecond(1000), Keys: 1, Prefix: "atmost:", Goroutines: 8,
		Duration: 3 * time.Second, Mode: "atmost", Cost: 7}
	eachLoad(t, spec, func(t *testing.T, reports []memberReport, total map[string]int64, bound int64, demanded func(string) int64) {
		got := total["hot"]
		t.Logf("fleet granted %d tokens; bound %d, %d while demanded", got, bound, demanded("hot"))
		if got > bound {
			t.Errorf("granted %d > one bucket's %d", got, bound)
		}
		if got < demanded("hot")*90/100 {
			t.Errorf("granted %d < 90%% of the %d one bucket allowed while demanded", got, demanded("hot"))
		}
	})
}

// TestDebtEveryTier: on every tier of token-bucket semantics, a caller
// charges an estimate and settles at 1.5 times it for 10 s, coming back
// when told (the tiers side by side), on a real Redis with default
// options: the tokens used stay within one bucket plus one overrun, where
// a Settle that stops at empty would let it use 1.5 buckets.
func TestDebtEveryTier(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 10 s")
	}
	srv := redistest.Start(t)
	for i, tr := range tiers {
		if tr.window {
			continue // the windows keep no debt (their Settle stops at empty)
		}
		// Each tier its own keys: hybrid's ledger is a token bucket's
		// state, which remote's token bucket under the same prefix would
		// share.
		prefix := fmt.Sprintf("debt%d:", i)
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			// A bucket of one request's use: every Settle finds it empty, as a
			// caller who comes back when told finds it.
			lim := tierlimit.PerSecond(40).WithBurst(overrunUsed)
			l := tr.open(t, srv.Client(t), lim, tierOptions{prefix: prefix})
			const goroutines = 1
			ctx := context.Background()
			start := time.Now()
			deadline := start.Add(10 * time.Second)
			var used, last atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						r, err := l.AllowN(ctx, "k", overrunCost)
						if err != nil {
							t.Error(err)
							return
						}
						if !r.Allowed {
							time.Sleep(r.RetryAfter) // a caller told when to come back
							continue
						}
						if _, err := l.Settle(ctx, "k", overrunCost, overrunUsed); err != nil {
							t.Error(err)
							return
						}
						used.Add(overrunUsed)
						last.Store(max(last.Load(), time.Now().UnixNano()))
					}
				})
			}
			wg.Wait()
			bound := lim.Capacity() + int64(time.Unix(0, last.Load()).Sub(start).Seconds()*float64(lim.Rate))
			limit := bound + goroutines*(overrunUsed-overrunCost)
			t.Logf("used %d tokens; one bucket over the run %d, with one overrun per caller %d", used.Load(), bound, limit)
			if got := used.Load(); got > limit || got < bound*85/100 {
				t.Errorf("used %d tokens, want at most one bucket %d plus an overrun per caller (%d), at least 85%% of the bucket", got, bound, limit)
			}
		})
	}
}
