package local

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// plenty never runs out during a benchmark: every call is admitted.
var plenty = tierlimit.Limit{Rate: 1_000_000_000, Period: 1e9, Burst: 1 << 40}

// hotKeyCases are BenchmarkHotKey's limiters: the limit passed to New, and
// the same limit from WithLimitFunc.
var hotKeyCases = []struct {
	name string
	opts []Option
}{
	{"default", nil},
	{"limitfunc", []Option{WithLimitFunc(func(string) tierlimit.Limit { return plenty })}},
}

func newHot(tb testing.TB, opts []Option) func() {
	tb.Helper()
	l, err := New(plenty, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	ctx := context.Background()
	return func() {
		if r, _ := l.Allow(ctx, "hot"); !r.Allowed {
			panic("denied")
		}
	}
}

// BenchmarkHotKey is one key that always has tokens, with and without
// WithLimitFunc (the bar: within 5%, no allocations), serial and from
// GOMAXPROCS goroutines. Compare with
//
//	benchstat -col /limit out.txt
//
// BenchmarkHotKeyPaired measures the difference less noisily.
func BenchmarkHotKey(b *testing.B) {
	for _, mode := range []string{"serial", "parallel"} {
		for _, c := range hotKeyCases {
			b.Run("mode="+mode+"/limit="+c.name, func(b *testing.B) {
				allow := newHot(b, c.opts)
				b.ReportAllocs()
				if mode == "serial" {
					for b.Loop() {
						allow()
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						allow()
					}
				})
			})
		}
	}
}

// BenchmarkHotKeyPaired times BenchmarkHotKey's two serial limiters in
// alternating batches, so that a slow spell of a shared machine falls on
// both alike. It reports default-ns and limitfunc-ns (the mean per call),
// limitfunc-% (their ratio: 100 = as fast), default-min-ns (the fastest
// batch per call) and limitfunc-min-% (the ratio of each path's fastest
// batch, which a busy machine disturbs least). The
// framework's ns/op is a pair of batches.
func BenchmarkHotKeyPaired(b *testing.B) {
	const batch = 64
	var paths [2]func()
	for i, c := range hotKeyCases {
		paths[i] = newHot(b, c.opts)
	}
	var ns [2]time.Duration
	fastest := [2]time.Duration{time.Hour, time.Hour}
	for b.Loop() {
		for i, f := range paths {
			t0 := time.Now()
			for range batch {
				f()
			}
			d := time.Since(t0)
			ns[i] += d
			fastest[i] = min(fastest[i], d)
		}
	}
	calls := float64(b.N * batch)
	b.ReportMetric(float64(ns[0])/calls, "default-ns")
	b.ReportMetric(float64(ns[1])/calls, "limitfunc-ns")
	b.ReportMetric(100*float64(ns[1])/float64(ns[0]), "limitfunc-%")
	b.ReportMetric(float64(fastest[0])/batch, "default-min-ns")
	b.ReportMetric(100*float64(fastest[1])/float64(fastest[0]), "limitfunc-min-%")
}

// TestHotKeyAllocs holds the hot path, with and without WithLimitFunc, to
// no allocation.
func TestHotKeyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	for _, c := range hotKeyCases {
		allow := newHot(t, c.opts)
		allow() // the key's bucket made
		if got := testing.AllocsPerRun(1000, allow); got != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", c.name, got)
		}
	}
}

// atMostCases are BenchmarkAtMost's calls on one key that always has
// tokens: AllowN and AllowAtMost of the same n.
var atMostCases = []struct {
	name string
	call func(l *Limiter, ctx context.Context)
}{
	{"AllowN", func(l *Limiter, ctx context.Context) {
		if r, _ := l.AllowN(ctx, "hot", 1); !r.Allowed {
			panic("denied")
		}
	}},
	{"AllowAtMost", func(l *Limiter, ctx context.Context) {
		if g, _, _ := l.AllowAtMost(ctx, "hot", 1); g != 1 {
			panic("not granted")
		}
	}},
}

// BenchmarkAtMost is AllowAtMost against AllowN of the same cost on a key
// that always has tokens, serial and from GOMAXPROCS goroutines. Compare
// with
//
//	benchstat -col /op out.txt
//
// BenchmarkAtMostPaired measures the difference less noisily.
func BenchmarkAtMost(b *testing.B) {
	for _, mode := range []string{"serial", "parallel"} {
		for _, c := range atMostCases {
			b.Run("mode="+mode+"/op="+c.name, func(b *testing.B) {
				l, err := New(plenty)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { l.Close() })
				ctx := context.Background()
				b.ReportAllocs()
				if mode == "serial" {
					for b.Loop() {
						c.call(l, ctx)
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						c.call(l, ctx)
					}
				})
			})
		}
	}
}

// BenchmarkAtMostPaired times AllowN and AllowAtMost on one limiter in
// alternating batches, as BenchmarkHotKeyPaired does: it reports
// allown-ns and atmost-ns (the mean per call), atmost-% (their ratio: 100
// = as fast) and atmost-min-% (the ratio of each call's fastest batch).
func BenchmarkAtMostPaired(b *testing.B) {
	const batch = 64
	l, err := New(plenty)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	ctx := context.Background()
	var ns [2]time.Duration
	fastest := [2]time.Duration{time.Hour, time.Hour}
	for b.Loop() {
		for i, c := range atMostCases {
			t0 := time.Now()
			for range batch {
				c.call(l, ctx)
			}
			d := time.Since(t0)
			ns[i] += d
			fastest[i] = min(fastest[i], d)
		}
	}
	calls := float64(b.N * batch)
	b.ReportMetric(float64(ns[0])/calls, "allown-ns")
	b.ReportMetric(float64(ns[1])/calls, "atmost-ns")
	b.ReportMetric(100*float64(ns[1])/float64(ns[0]), "atmost-%")
	b.ReportMetric(100*float64(fastest[1])/float64(fastest[0]), "atmost-min-%")
}

// TestAtMostAllocs holds AllowAtMost on a hot key to no allocation, as
// AllowN is held.
func TestAtMostAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	l, err := New(plenty)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	call := func() { atMostCases[1].call(l, ctx) }
	call()
	if got := testing.AllocsPerRun(1000, call); got != 0 {
		t.Errorf("%v allocations per AllowAtMost, want 0", got)
	}
}
