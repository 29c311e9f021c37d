package local

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestClockStepsBack steps the injected clock back and forward again over
// a drained 10/s key: a step back refills nothing and takes nothing, and
// the interval stepped over twice refills once (x/time/rate, which moves
// its last update back with the clock, would refill it again: 5 tokens at
// step 4).
func TestClockStepsBack(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(10))
	runSteps(t, l, clock, "k", []step{
		{0, 10, true, 0, 0},                               // drained at t0
		{500 * time.Millisecond, 0, true, 5, 0},           // t0+500ms: 5 refilled
		{-500 * time.Millisecond, 0, true, 5, 0},          // back to t0: nothing refilled, nothing taken
		{0, 5, true, 0, 0},                                // drained again at t0
		{500 * time.Millisecond, 0, true, 0, 0},           // t0+500ms again: refilled once already
		{100 * time.Millisecond, 1, true, 0, 0},           // t0+600ms: the one new token
		{-time.Hour, 0, true, 0, 0},                       // an hour back: still nothing
		{time.Hour + 200*time.Millisecond, 2, true, 0, 0}, // t0+800ms: the 2 since t0+600ms
	})
}
