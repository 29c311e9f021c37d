package hybrid

import (
	"context"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"golang.org/x/time/rate"
)

// plenty never runs out during a benchmark: every call takes the lease path.
var plenty = tierlimit.Limit{Rate: 1_000_000, Period: 1e9, Burst: 1 << 40}

// onMiniredis returns a limiter of plenty on a miniredis, both closed when
// the benchmark ends.
func onMiniredis(b *testing.B) (*Limiter, *miniredis.Miniredis) {
	m := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	b.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, plenty)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l, m
}

// hotKey returns a limiter of plenty whose key "hot" holds a lease, on a
// miniredis the benchmark closes.
func hotKey(b *testing.B) *Limiter {
	l, _ := onMiniredis(b)
	for i := 0; i < 1000; i++ {
		l.Allow(context.Background(), "hot")
	}
	return l
}

// BenchmarkAllowLease is the hot path: a hot key whose lease always holds
// tokens. Compare with BenchmarkXRate (golang.org/x/time/rate, one limiter).
func BenchmarkAllowLease(b *testing.B) {
	l := hotKey(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r, _ := l.Allow(ctx, "hot"); !r.Allowed {
			b.Fatal("denied")
		}
	}
}

func BenchmarkXRate(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(plenty.Rate), int(plenty.Burst))
	b.ReportAllocs()
	for b.Loop() {
		if !l.Allow() {
			b.Fatal("denied")
		}
	}
}

// BenchmarkAllowAtMostLease is BenchmarkAllowLease's hot key taken with
// AllowAtMost, one token at most and eight: its bar is AllowN's cost
// within 10%.
func BenchmarkAllowAtMostLease(b *testing.B) {
	l := hotKey(b)
	ctx := context.Background()
	for _, n := range []int64{1, 8} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got, _, _ := l.AllowAtMost(ctx, "hot", n); got == 0 {
					b.Fatal("denied")
				}
			}
		})
	}
}

// BenchmarkAllowOutage is a hot key's decision while Redis is down and the
// breaker open: the fallback bucket decides (FailFallback, the default).
// miniredis is closed once the key holds no lease; the probes that follow
// fail at once (connection refused).
func BenchmarkAllowOutage(b *testing.B) {
	l, m := onMiniredis(b)
	ctx := context.Background()
	l.Allow(ctx, "hot")
	m.Close()
	for i := 0; l.Stats().Breaker != tierlimit.BreakerOpen; i++ {
		if i == 100_000 {
			b.Fatalf("the breaker did not open: %+v", l.Stats())
		}
		l.Allow(ctx, "hot")
	}
	b.ReportAllocs()
	for b.Loop() {
		if r, _ := l.Allow(ctx, "hot"); r.Source != tierlimit.SourceFallback && r.Source != tierlimit.SourceLocal {
			b.Fatalf("decided by %v with Redis down", r.Source)
		}
	}
}
