package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tierlimit/tierlimit/local"
)

// TestPermitMetrics: a concurrency limiter's acquisitions, counted by
// result, and the waits of Acquire.
func TestPermitMetrics(t *testing.T) {
	c := mustNew(t, WithDecisionBuckets(1e-3, 1))
	conc, err := local.NewConcurrency(1, local.WithPermitObserver(c.Observer("conc")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, _, _ := conc.TryAcquire(ctx, "k") // acquired
	conc.TryAcquire(ctx, "k")            // refused
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	conc.Acquire(short, "k") // gave up
	p.Release()
	want := `
# HELP tierlimit_permits_total Acquisitions of concurrency limiters' permits, by the tier that decided and their result.
# TYPE tierlimit_permits_total counter
tierlimit_permits_total{limiter="conc",result="acquired",source="local"} 1
tierlimit_permits_total{limiter="conc",result="gave_up",source="local"} 1
tierlimit_permits_total{limiter="conc",result="refused",source="local"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "tierlimit_permits_total"); err != nil {
		t.Error(err)
	}
	h := histogram(t, c, "tierlimit_permit_wait_seconds", map[string]string{"limiter": "conc"})
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 5e-3 {
		t.Errorf("permit_wait_seconds: count %d, sum %g; want 1, at least 0.005", h.GetSampleCount(), h.GetSampleSum())
	}
}
