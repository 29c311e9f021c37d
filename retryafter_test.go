package tierlimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/remote"
)

// TestHonestRetryAfter is G2's table: a hybrid key drained by one instance,
// with default options, then asked for costs from 1 to the burst. Each
// denial's RetryAfter is for the caller's own cost: at least the exact
// answer of the token bucket in Redis (a caller that waits it is admitted)
// and at most twice it plus the refill interval, for limits per second,
// minute and day.
func TestHonestRetryAfter(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	ctx := context.Background()
	for i, limit := range []tierlimit.Limit{
		tierlimit.PerSecond(10), tierlimit.PerSecond(1000), tierlimit.PerMinute(100),
		tierlimit.PerMinute(2_000_000), tierlimit.PerDay(1_000_000),
		// Prime quotas past 2^53 units, and a year-long period (issue 17).
		tierlimit.PerDay(1_000_003), tierlimit.PerDay(10_000_019),
		{Rate: 1_000_003, Period: 30 * 24 * time.Hour}, {Rate: 3, Period: 400 * 24 * time.Hour},
	} {
		t.Run(limit.String(), func(t *testing.T) {
			prefix := fmt.Sprintf("g2-%d:", i)
			l, err := hybrid.New(rdb, limit, hybrid.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			exact, err := remote.NewTokenBucket(rdb, limit, remote.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			burst := limit.Capacity()
			if r, err := l.AllowN(ctx, "k", burst); err != nil || !r.Allowed {
				t.Fatalf("draining AllowN(burst %d) = %+v, %v", burst, r, err)
			}
			compared := 0
			for _, cost := range []int64{1, max(1, burst/10), max(1, burst/2), burst} {
				asked := time.Now()
				got, err := l.AllowN(ctx, "k", cost)
				if err != nil {
					t.Fatal(err)
				}
				// The bucket's own answer, asked after: it can only be
				// shorter, as time passed.
				peek, err := exact.AllowN(ctx, "k", 0)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed || peek.Remaining+l.Stats().Held >= cost {
					continue // enough accrued meanwhile: nothing to compare
				}
				want, err := exact.AllowN(ctx, "k", cost) // denied: charges nothing
				if err != nil {
					t.Fatal(err)
				}
				// The bucket's wait when got was decided was at most this
				// much longer: it shrinks as time passes (CI under -race
				// saw about 7 ms between the two on a 10M/day key, whose wait
				// for a token is 8.6 ms).
				late := time.Since(asked)
				if want.Allowed {
					// Enough accrued since the peek (at 1000/s, a token a
					// ms): give the charge back, so that it does not skew
					// the costs compared after this one.
					if _, err := exact.Settle(ctx, "k", cost, 0); err != nil {
						t.Fatal(err)
					}
					continue
				}
				compared++
				// One bucket's answer counts the tokens this instance
				// holds in its lease too.
				held := l.Stats().Held
				lo := want.RetryAfter - time.Duration(float64(held)*float64(limit.Period)/float64(limit.Rate)) - time.Microsecond
				hi := 2*(want.RetryAfter+late) + hybrid.DefaultRefillInterval + 5*time.Millisecond
				if got.RetryAfter < lo || got.RetryAfter > hi {
					t.Errorf("cost %d: RetryAfter %v, want between %v (the bucket's %v, less the %d tokens held) and %v",
						cost, got.RetryAfter, lo, want.RetryAfter, held, hi)
				}
			}
			if compared < 2 {
				t.Errorf("%d costs compared with the bucket, want at least 2: the test no longer measures", compared)
			}
			if every := limit.RefillTime(1); every > 50*time.Millisecond && every < time.Second {
				// Alone on the key, a caller that waits its RetryAfter is
				// admitted (where the wait is short enough for a test).
				r, _ := l.AllowN(ctx, "k", 1)
				if r.RetryAfter > 2*every+hybrid.DefaultRefillInterval {
					t.Fatalf("cost 1: RetryAfter %v, want at most %v", r.RetryAfter, 2*every+hybrid.DefaultRefillInterval)
				}
				time.Sleep(r.RetryAfter)
				if r2, err := l.AllowN(ctx, "k", 1); err != nil || !r2.Allowed {
					t.Errorf("after waiting RetryAfter %v: %+v, %v; want admitted", r.RetryAfter, r2, err)
				}
			}
		})
	}
}
