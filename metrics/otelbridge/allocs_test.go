package otelbridge

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestDecisionAllocs checks that recording a decision allocates nothing,
// from a lease (local) as from Redis (remote, whose duration is
// recorded).
func TestDecisionAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	b, _ := newBridge(t)
	o := b.Observer("api")
	for _, src := range []tierlimit.Source{tierlimit.SourceLocal, tierlimit.SourceRemote} {
		d := tierlimit.Decision{Allowed: true, Source: src, N: 1, Latency: time.Microsecond, Limit: tierlimit.PerSecond(100)}
		o.Decision(d)
		if got := testing.AllocsPerRun(1000, func() { o.Decision(d) }); got != 0 {
			t.Errorf("Decision from %v allocates %v times, want 0", src, got)
		}
	}
}
