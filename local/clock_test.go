package local

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestClockStepsBack steps the injected clock back and forward again over
// a drained 10/s key: the step back refills nothing and takes nothing, and
// the interval stepped over twice refills once (x/time/rate, which moves
// its last update back with the clock, would refill it again: 5 tokens at
// step 4).
func TestClockStepsBack(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(10))
	ctx := context.Background()
	steps := []struct {
		step      time.Duration
		n         int64
		allowed   bool
		remaining int64
	}{
		{0, 10, true, 0},                               // drained at t0
		{500 * time.Millisecond, 0, true, 5},           // t0+500ms: 5 refilled
		{-500 * time.Millisecond, 0, true, 5},          // back to t0: nothing refilled, nothing taken
		{0, 5, true, 0},                                // drained again at t0
		{500 * time.Millisecond, 0, true, 0},           // t0+500ms again: refilled once already
		{100 * time.Millisecond, 1, true, 0},           // t0+600ms: the one new token
		{-time.Hour, 1, false, 0},                      // an hour back: still nothing
		{time.Hour + 200*time.Millisecond, 2, true, 0}, // t0+800ms: the 2 since t0+600ms
	}
	for i, s := range steps {
		clock.Add(s.step)
		r, err := l.AllowN(ctx, "k", s.n)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != s.allowed || r.Remaining != s.remaining {
			t.Errorf("step %d: clock moved %v, AllowN(%d) = %v, %d remaining; want %v, %d",
				i, s.step, s.n, r.Allowed, r.Remaining, s.allowed, s.remaining)
		}
	}
}
