package outage

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/pulse"
	"github.com/tierlimit/tierlimit/internal/pulse/pulsetest"
)

func TestGuard(t *testing.T) {
	const budget = 10 * time.Millisecond
	refused := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	tests := []struct {
		name     string
		silence  time.Duration // since Redis last answered
		outcomes []error
		wantDown bool
		outages  uint64 // times the breaker opened
	}{
		{"answers", 0, []error{nil, nil, nil}, false, 0},
		{"error replies are answers", 0, []error{redis.Nil, redis.Nil, redis.Nil}, false, 0},
		{"refused thrice", 0, []error{refused, refused, refused}, true, 1},
		{"refused twice then an answer", 0, []error{refused, refused, nil}, false, 0},
		{"slow while Redis answers", 0, []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}, false, 0},
		{"deadlines while Redis is silent", 10 * budget, []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}, true, 1},
		{"probes failing keep one outage", 0, []error{refused, refused, refused, refused, refused}, true, 1},
		{"open, answered, then old calls fail", 0, []error{refused, refused, refused, nil, refused, refused, refused}, false, 1},
		{"open then answered", 0, []error{refused, refused, refused, nil}, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := New(budget, 3, time.Hour)
			g.heard = time.Now().Add(-tt.silence)
			start := time.Now().Add(-tt.silence)
			for _, err := range tt.outcomes {
				g.Done(start, err)
			}
			if got := g.Down(); got != tt.wantDown {
				t.Errorf("Down() = %v, want %v", got, tt.wantDown)
			}
			if got := g.Allow(); got == tt.wantDown {
				t.Errorf("Allow() = %v, want %v", got, !tt.wantDown)
			}
			if down, outages := g.State(); down != tt.wantDown || outages != tt.outages {
				t.Errorf("State() = %v, %d, want %v, %d", down, outages, tt.wantDown, tt.outages)
			}
		})
	}
}

// TestGuardOldFailures: failures of calls sent before an answer closed
// the breaker do not open it again; those sent after do.
func TestGuardOldFailures(t *testing.T) {
	refused := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	g := New(10*time.Millisecond, 3, time.Hour)
	sent := time.Now()
	for range 3 {
		g.Done(sent, refused)
	}
	time.Sleep(time.Millisecond)
	g.Done(time.Now(), nil)
	for range 3 {
		g.Done(sent, refused)
		g.Late(sent)
	}
	if down, outages := g.State(); down || outages != 1 {
		t.Fatalf("State() = %v, %d after failures of calls sent before the answer, want false, 1", down, outages)
	}
	for range 3 {
		g.Done(time.Now(), refused)
	}
	if down, outages := g.State(); !down || outages != 2 {
		t.Errorf("State() = %v, %d after three failures of calls sent since, want true, 2", down, outages)
	}
}

// TestGuardLate: a call still in flight counts as failed at each budget's
// end once Redis has been silent since the call began for the stall time.
func TestGuardLate(t *testing.T) {
	const budget = 10 * time.Millisecond
	g := New(budget, 3, 20*time.Millisecond)
	start := time.Now()
	g.Late(start) // just started: not yet
	if g.failures != 0 {
		t.Fatalf("failures = %d after Late at the start, want 0", g.failures)
	}
	old := start.Add(-stallBudgets * budget)
	g.heard = old
	for range 3 {
		g.Late(old)
	}
	if !g.Down() || g.Allow() {
		t.Errorf("Down, Allow = %v, %v after 3 late calls in silence, want true, false", g.Down(), g.Allow())
	}
	time.Sleep(25 * time.Millisecond)
	if !g.Allow() || !g.Down() {
		t.Errorf("after the probe interval Allow, Down = %v, %v, want true, true (probing, still down)", g.Allow(), g.Down())
	}
	g.Done(time.Now(), nil)
	if g.Down() {
		t.Errorf("Down() = true after an answer, want false")
	}
}

// TestGuardStoppedProcess: calls whose budgets ran out while this process
// was stopped for 400 ms (their replies waiting, unread) are not Redis's
// silence: the process lost that time itself (internal/pulse). A silence
// that lasts after the process runs again still counts.
func TestGuardStoppedProcess(t *testing.T) {
	pulse.Start()
	defer pulse.Stop()
	time.Sleep(3 * pulse.Period)
	const budget = 10 * time.Millisecond
	g := New(budget, 3, time.Hour)
	start := time.Now()
	g.Done(start, nil) // Redis answered just now
	pulsetest.StopSelf(t, 400*time.Millisecond)
	for range 3 {
		g.Late(start)
		g.Done(start, context.DeadlineExceeded)
	}
	if g.Down() {
		t.Fatalf("Down() after three calls over their budget during a 400 ms stop of the process, want false (stall %v)", g.stall())
	}
	// Redis silent for 10 budgets more, the process running: an outage.
	time.Sleep(10 * budget)
	for range 3 {
		g.Late(start)
	}
	if !g.Down() {
		t.Errorf("Down() after three calls over their budget in 100 ms of silence, the process running: false, want true")
	}
}
