package tenanttest

import (
	"context"
	"math/big"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// Budget is what a tier offers for charges corrected after the fact and
// for batches: AllowN, Settle (into debt) and AllowAtMost.
type Budget interface {
	AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
	AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error)
}

// use is what a tenant used at a time: admitted, or taken by a Settle.
type use struct {
	at time.Time
	n  int64
}

// CheckOverrun runs a tenant on key, of limit, whose every request is
// charged its estimate est and really uses est + est/2 (Settle takes the
// rest, into debt when the key lacks it), one request at a time, for
// steps calls; set moves the limiter's clock (forward by random steps of
// up to step) from start. Over every interval between two calls, what
// the tenant used (admitted, plus what Settle took) must stay within one
// bucket plus one request's overrun: Capacity + Rate·T/Period + est/2.
// It returns how many requests were admitted.
func CheckOverrun(t *testing.T, l Budget, key string, limit tierlimit.Limit, est int64, start time.Time, step time.Duration, steps int, set func(time.Time)) int {
	t.Helper()
	ctx := context.Background()
	over := est / 2
	rng := rand.New(rand.NewPCG(uint64(est), uint64(steps)))
	now := start
	set(now)
	var uses []use
	admitted := 0
	for range steps {
		now = now.Add(time.Duration(rng.Int64N(int64(step) + 1)))
		set(now)
		r, err := l.AllowN(ctx, key, est)
		if err != nil {
			t.Fatalf("AllowN(%q, %d) at %v: %v", key, est, now.Sub(start), err)
		}
		if !r.Allowed {
			if r.RetryAfter <= 0 {
				t.Fatalf("AllowN(%q, %d) at %v denied with RetryAfter %v", key, est, now.Sub(start), r.RetryAfter)
			}
			continue
		}
		admitted++
		if _, err := l.Settle(ctx, key, est, est+over); err != nil {
			t.Fatalf("Settle(%q, %d, %d): %v", key, est, est+over, err)
		}
		uses = append(uses, use{now, est + over})
	}
	checkUses(t, uses, limit, over)
	return admitted
}

// checkUses checks that every interval between two uses (both counted)
// used at most Capacity + Rate·T/Period + over, in exact arithmetic.
func checkUses(t *testing.T, uses []use, limit tierlimit.Limit, over int64) {
	t.Helper()
	for i := range uses {
		var sum int64
		for j := i; j < len(uses); j++ {
			sum += uses[j].n
			// sum·Period <= (Capacity + over)·Period + Rate·T
			d := uses[j].at.Sub(uses[i].at)
			lhs := new(big.Int).Mul(big.NewInt(sum), big.NewInt(int64(limit.Period)))
			rhs := new(big.Int).Mul(big.NewInt(limit.Capacity()+over), big.NewInt(int64(limit.Period)))
			rhs.Add(rhs, new(big.Int).Mul(big.NewInt(limit.Rate), big.NewInt(int64(d))))
			if lhs.Cmp(rhs) > 0 {
				t.Fatalf("used %d over %v (uses %d to %d of %d), want at most %d + %v of refill + %d overrun",
					sum, d, i, j, len(uses), limit.Capacity(), d, over)
			}
		}
	}
}

// CheckAtMostConcurrent has goroutines call AllowAtMost on key, each
// asking a random 1 to capacity/64, until each is denied, on a clock that
// does not move: what they were granted in all must be exactly capacity,
// one bucket, and every denial must say when one token comes.
func CheckAtMostConcurrent(t *testing.T, l Budget, key string, capacity int64, goroutines int) {
	t.Helper()
	ctx := context.Background()
	var (
		mu    sync.Mutex
		total int64
		wg    sync.WaitGroup
		calls atomic.Int64
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for {
				n := 1 + rng.Int64N(max(1, capacity/64))
				got, r, err := l.AllowAtMost(ctx, key, n)
				if err != nil {
					t.Error(err)
					return
				}
				if got < 0 || got > n || r.Allowed != (got > 0) || !r.Allowed && r.RetryAfter <= 0 {
					t.Errorf("AllowAtMost(%q, %d) = %d, %+v", key, n, got, r)
					return
				}
				if got == 0 {
					return
				}
				calls.Add(1)
				mu.Lock()
				total += got
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if total != capacity {
		t.Errorf("%d goroutines were granted %d in all, want %d (one bucket)", goroutines, total, capacity)
	}
	t.Logf("%d goroutines: %d calls granted %d in all", goroutines, calls.Load(), total)
}
