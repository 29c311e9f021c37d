package tierlimit_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestSettleAboveBurst: on every tier that runs on its client's clock,
// on a real redis-server, at one frozen instant, Settle accepts a used
// above the burst, charges what the key can hold (its level down to minus
// Burst on a bucket, its window up to Rate on a window) and reports the
// rest as Result.Uncharged; a negative used is ErrInvalidCost, a charged
// above the burst too (it was admitted).
func TestSettleAboveBurst(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	limit := tierlimit.PerSecond(10)
	type step struct {
		reset         bool  // Reset the key first: full again
		allow         int64 // AllowN(allow) first, when > 0
		charged, used int64
		// Uncharged on a bucket (room: its whole tokens + 10) and on a
		// window (room: 10 - its count).
		bucket, window int64
	}
	steps := []step{
		{used: 25, bucket: 5, window: 15},                                     // full: room 20 and 10
		{used: 3, bucket: 3, window: 3},                                       // at the floor, at Rate: no room
		{charged: 3, used: 3},                                                 // nothing to correct
		{reset: true, allow: 4, charged: 4, used: 30, bucket: 10, window: 20}, // room 16 and 6 for 26
		{reset: true, used: math.MaxInt64, bucket: math.MaxInt64 - 20, window: math.MaxInt64 - 10},
		{reset: true, allow: 3, charged: 3, used: math.MaxInt64, bucket: math.MaxInt64 - 3 - 17, window: math.MaxInt64 - 3 - 7},
	}
	for _, tier := range tiers {
		if !tier.clocked {
			continue // hybrid: TestSettleAboveBurst in package hybrid, on its stepped clock
		}
		t.Run(tier.name, func(t *testing.T) {
			ctx := context.Background()
			clock := clocktest.New(time.Unix(1_700_000_000, 0))
			l := tier.open(t, rdb, limit, tierOptions{clock: clock, prefix: "aboveburst:"})
			key := "upload:" + tier.name
			for i, s := range steps {
				if s.reset {
					if err := l.Reset(ctx, key); err != nil {
						t.Fatal(err)
					}
				}
				if s.allow > 0 {
					if r, err := l.AllowN(ctx, key, s.allow); err != nil || !r.Allowed {
						t.Fatalf("step %d: AllowN(%d) = %+v, %v; want allowed", i, s.allow, r, err)
					}
				}
				want := s.bucket
				if tier.window {
					want = s.window
				}
				r, err := l.Settle(ctx, key, s.charged, s.used)
				if err != nil || !r.Allowed || r.Uncharged != want || r.Remaining != 0 && s.used > s.charged {
					t.Errorf("step %d: Settle(%d, %d) = %+v, %v; want Allowed, Remaining 0, Uncharged %d",
						i, s.charged, s.used, r, err, want)
				}
			}
			for _, c := range [][2]int64{{0, -1}, {11, 11}, {-1, 0}} {
				if _, err := l.Settle(ctx, key, c[0], c[1]); !errors.Is(err, tierlimit.ErrInvalidCost) {
					t.Errorf("Settle(%d, %d) = %v, want ErrInvalidCost", c[0], c[1], err)
				}
			}
		})
	}
}
