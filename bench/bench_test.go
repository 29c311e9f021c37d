package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestPeersAgree checks that every peer enforces the same limit the same
// way on a fresh key: Capacity events admitted, counting Remaining down to 0,
// then a denial. The period is a day so that neither refill nor a fixed
// window's boundary can plausibly fall within the test's few milliseconds.
func TestPeersAgree(t *testing.T) {
	const burst = 10
	l := tierlimit.Limit{Rate: burst, Period: 24 * time.Hour}
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, p := range peers {
		t.Run(p.name, func(t *testing.T) {
			allow, err := p.build(rdb, l)
			if err != nil {
				t.Fatalf("build %s for %v: %v", p.name, l, err)
			}
			key := "fresh:" + p.name
			for i := range burst + 1 {
				ok, rem, err := allow(ctx, key)
				if err != nil {
					t.Fatalf("Allow #%d: %v", i+1, err)
				}
				wantOK, wantRem := i < burst, int64(max(burst-1-i, 0))
				if ok != wantOK || rem != wantRem {
					t.Errorf("Allow #%d = (allowed %v, remaining %d), want (%v, %d)", i+1, ok, rem, wantOK, wantRem)
				}
			}
		})
	}
}

// TestBenchLimitersBuild checks that every peer accepts the benchmarks'
// limits and answers them as the benchmarks expect on a fresh key.
func TestBenchLimitersBuild(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, l := range []tierlimit.Limit{tierlimit.PerSecond(1_000_000), tierlimit.PerHour(1)} {
		for _, p := range peers {
			t.Run(fmt.Sprintf("%s/%v", p.name, l), func(t *testing.T) {
				allow, err := p.build(rdb, l)
				if err != nil {
					t.Fatalf("build %s for %v: %v", p.name, l, err)
				}
				key := fmt.Sprintf("build:%v", l)
				for i, want := range []bool{true, l.Rate > 1} {
					ok, _, err := allow(ctx, key)
					if err != nil || ok != want {
						t.Fatalf("Allow #%d = %v, %v; want %v, nil", i+1, ok, err, want)
					}
				}
			})
		}
	}
}
