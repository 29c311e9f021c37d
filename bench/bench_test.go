package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	// BenchmarkCompare's contenders, each on its own client as there. Those
	// that do not report a remaining count are checked on allowed alone.
	for _, c := range contenders {
		t.Run("compare/"+c.name, func(t *testing.T) {
			f := buildForTest(t, rdb, c, l)
			for i := range burst + 1 {
				ok, rem, err := f.allow(ctx, "fresh:compare")
				if err != nil {
					t.Fatalf("Allow #%d: %v", i+1, err)
				}
				wantOK, wantRem := i < burst, int64(max(burst-1-i, 0))
				if ok != wantOK || rem != unknownRemaining && rem != wantRem {
					t.Errorf("Allow #%d = (allowed %v, remaining %d), want (%v, %d)", i+1, ok, rem, wantOK, wantRem)
				}
			}
		})
	}
}

// TestContendersAdmitTheLimit checks that every contender of
// BenchmarkCompare, asked as fast as it answers on one key for half a
// second, admits about what the limit allows in that time: the bucket, then
// Rate per Period (a fixed window admits Rate per window, between 5/6 and 1
// of that). A contender wired with the wrong unit or burst misses by far more
// than the 25% allowed.
func TestContendersAdmitTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for half a second")
	}
	l := tierlimit.Limit{Rate: 20, Period: 100 * time.Millisecond}
	const runFor = 500 * time.Millisecond
	rdb := redistest.Start(t).Client(t)
	for _, c := range contenders {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := buildForTest(t, rdb, c, l)
			ctx := context.Background()
			var admitted, calls int64
			start := time.Now()
			for time.Since(start) < runFor {
				ok, _, err := f.allow(ctx, "rate:"+c.name)
				if err != nil {
					t.Fatalf("Allow #%d: %v", calls+1, err)
				}
				calls++
				if ok {
					admitted++
				}
			}
			elapsed := time.Since(start)
			want := float64(l.Capacity()) + float64(l.Rate)*float64(elapsed)/float64(l.Period)
			t.Logf("admitted %d of %d calls in %v (limit allows %.0f)", admitted, calls, elapsed, want)
			if got := float64(admitted); got < 0.75*want || got > 1.25*want {
				t.Errorf("admitted %d of %d calls in %v, want %.0f ± 25%%", admitted, calls, elapsed, want)
			}
		})
	}
}

// buildForTest builds c for l on a client of its own (with rdb's address)
// and releases it at the end of t.
func buildForTest(t *testing.T, rdb *redis.Client, c contender, l tierlimit.Limit) fixture {
	t.Helper()
	var own *redis.Client
	if c.where != inProcess {
		own = redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DisableIdentity: true})
		t.Cleanup(func() { _ = own.Close() })
	}
	f, err := c.build(own, l)
	if err != nil {
		t.Fatalf("build %s for %v: %v", c.name, l, err)
	}
	t.Cleanup(func() {
		if err := f.close(); err != nil {
			t.Error(err)
		}
	})
	return f
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
