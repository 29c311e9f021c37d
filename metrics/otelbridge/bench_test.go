package otelbridge

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// BenchmarkDecision measures what the bridge records per decision: the
// Observer's Decision func, as a hot key's decision from a lease calls it,
// into the SDK with a ManualReader.
//
//	go test -run '^$' -bench 'Decision$' -benchmem -count 10 .
func BenchmarkDecision(b *testing.B) {
	br, _ := newBridge(b)
	o := br.Observer("api")
	d := tierlimit.Decision{Allowed: true, Source: tierlimit.SourceLocal, N: 1, Latency: 300 * time.Nanosecond, Limit: tierlimit.PerSecond(100)}
	b.ReportAllocs()
	for b.Loop() {
		o.Decision(d)
	}
}

// BenchmarkHotKey measures a hybrid limiter's decision on one hot key
// (served from its lease) without an observer, with one that records
// nothing (what observing costs the limiter: its clock reads) and with
// the bridge's, in one run: otel minus noop is what the bridge adds.
//
//	go test -run '^$' -bench HotKey -benchmem -count 10 . | tee /tmp/otel.txt
//	benchstat -col /observer /tmp/otel.txt
func BenchmarkHotKey(b *testing.B) {
	_, rdb := redistest.Mini(b)
	for _, observer := range []string{"none", "noop", "otel"} {
		b.Run("observer="+observer, func(b *testing.B) {
			var opts []hybrid.Option
			switch observer {
			case "noop": // the clock reads of an observed decision, nothing recorded
				opts = append(opts, hybrid.WithObserver(&tierlimit.Observer{Decision: func(tierlimit.Decision) {}}))
			case "otel":
				br, _ := newBridge(b)
				opts = append(opts, hybrid.WithObserver(br.Observer("api")))
			}
			lim, err := hybrid.New(rdb, tierlimit.PerSecond(1_000_000_000), opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close()
			ctx := context.Background()
			for i := 0; i < 1000; i++ { // the lease is claimed
				if _, err := lim.AllowN(ctx, "hot", 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if res, err := lim.AllowN(ctx, "hot", 1); err != nil || !res.Allowed {
					b.Fatalf("AllowN = %+v, %v", res, err)
				}
			}
		})
	}
}
