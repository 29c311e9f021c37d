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
	start := time.Now()
	conc.Acquire(short, "k") // gave up
	took := time.Since(start)
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
	// The wait is Acquire's own, from its start to its giving up: more than
	// nothing, at most what the test measured around the call. (Not at
	// least the 5 ms timeout: the timeout's clock starts before Acquire
	// does; CI at 300f743 saw 4.0 ms.)
	if sum := h.GetSampleSum(); h.GetSampleCount() != 1 || sum <= 0 || sum > took.Seconds() {
		t.Errorf("permit_wait_seconds: count %d, sum %g; want 1, more than 0 and at most %g (the call's time)", h.GetSampleCount(), sum, took.Seconds())
	}
}
