package local

import (
	"context"
	"testing"

	"github.com/tierlimit/tierlimit"
)

// plenty never runs out during a benchmark: every call is admitted.
var plenty = tierlimit.Limit{Rate: 1_000_000_000, Period: 1e9, Burst: 1 << 40}

// BenchmarkHotKey is one key that always has tokens: the limit passed to
// New, and the same limit from WithLimitFunc (the bar: within 5%, no
// allocations), serial and from GOMAXPROCS goroutines.
func BenchmarkHotKey(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"limitfunc", []Option{WithLimitFunc(func(string) tierlimit.Limit { return plenty })}},
	} {
		l, err := New(plenty, c.opts...)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if r, _ := l.Allow(ctx, "hot"); !r.Allowed {
					b.Fatal("denied")
				}
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r, _ := l.Allow(ctx, "hot"); !r.Allowed {
						b.Fatal("denied")
					}
				}
			})
		})
		l.Close()
	}
}
