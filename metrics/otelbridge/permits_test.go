package otelbridge

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// histogram collects reader and returns the one data point of the
// float64 histogram name.
func histogram(t *testing.T, reader *sdkmetric.ManualReader, name string) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok || len(h.DataPoints) != 1 {
				t.Fatalf("%s is %+v, want a float64 histogram of one data point", name, m.Data)
			}
			return h.DataPoints[0]
		}
	}
	t.Fatalf("no %s collected", name)
	return metricdata.HistogramDataPoint[float64]{}
}

// TestPermitMetrics: a concurrency limiter's acquisitions, counted by
// source and result, and the waits of Acquire, as package metrics'
// TestPermitMetrics has them from its collector.
func TestPermitMetrics(t *testing.T) {
	b, reader := newBridge(t)
	conc, err := local.NewConcurrency(1, local.WithPermitObserver(b.Observer("conc")))
	if err != nil {
		t.Fatal(err)
	}
	defer conc.Close()
	ctx := context.Background()
	p, _, _ := conc.TryAcquire(ctx, "k") // acquired
	conc.TryAcquire(ctx, "k")            // rejected
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	start := time.Now()
	conc.Acquire(short, "k") // gave up
	took := time.Since(start)
	p.Release()

	got := sums(t, reader, "tierlimit.rate_limiting.permits", AttrLimiter, AttrSource, AttrResult)
	want := map[string]int64{
		"conc,local,acquired": 1,
		"conc,local,rejected": 1,
		"conc,local,gave_up":  1,
	}
	if len(got) != len(want) {
		t.Errorf("permits = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("permits{%s} = %d, want %d", k, got[k], v)
		}
	}
	// The wait is Acquire's own, from its start to its giving up: more
	// than nothing, at most what the test measured around the call.
	h := histogram(t, reader, "tierlimit.rate_limiting.permit.wait.duration")
	if h.Count != 1 || h.Sum <= 0 || h.Sum > took.Seconds() {
		t.Errorf("permit.wait.duration: count %d, sum %g; want 1, more than 0 and at most %g (the call's time)", h.Count, h.Sum, took.Seconds())
	}
}

// TestPermitAllocs checks that counting a permit allocates nothing.
func TestPermitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	b, _ := newBridge(t)
	o := b.Observer("conc")
	for _, d := range []tierlimit.PermitDecision{
		{Acquired: true, Source: tierlimit.SourceRemote},
		{Source: tierlimit.SourceLocal},
		{Source: tierlimit.Source(200)}, // unknown
	} {
		o.Permit(d)
		if got := testing.AllocsPerRun(1000, func() { o.Permit(d) }); got != 0 {
			t.Errorf("Permit(%+v) allocates %v times, want 0", d, got)
		}
	}
}
