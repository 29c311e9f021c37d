package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// phaseWarmUp is the outage run's start, while the initial burst drains:
// not recorded.
const phaseWarmUp = -1

// The recorded phases of the demo's outage run.
const (
	phaseBefore = iota // Redis up
	phaseDown          // the embedded Redis killed
	phaseAfter         // restarted, empty, on the same port
	phases
)

// timeline records a paced run of several fleets at once, across phases:
// per strategy, what was admitted and how many calls failed, per time bin
// (for the chart) and per phase (for the table). It is safe for concurrent
// use.
type timeline struct {
	start time.Time
	bin   time.Duration
	phase atomic.Int32
	// gate is held shared by every call and exclusively by a phase
	// change, so that no call is in flight across one: each call is
	// answered wholly before or wholly after a kill or restart.
	gate sync.RWMutex

	mu      sync.Mutex
	changes [phases]time.Duration // when each phase began, since start
	series  map[string]*series    // by strategy; fixed once the run starts
}

// series is one strategy's counts.
type series struct {
	admitted, errors []atomic.Int64 // per bin
	decisions        [phases]atomic.Int64
	admits           [phases]atomic.Int64
	errs             [phases]atomic.Int64
	lastErr          [phases]atomic.Pointer[string]
}

func newTimeline(strategies []string, d, bin time.Duration) *timeline {
	t := &timeline{bin: bin, series: make(map[string]*series)}
	t.phase.Store(phaseWarmUp)
	n := int(d/bin) + 1
	for _, s := range strategies {
		t.series[s] = &series{admitted: make([]atomic.Int64, n), errors: make([]atomic.Int64, n)}
	}
	return t
}

// begin ends the warm-up and starts the clock: calls are recorded from now.
func (t *timeline) begin() {
	t.start = time.Now()
	t.phase.Store(phaseBefore) // publishes start to the recording goroutines
}

// change runs action, which kills or restarts Redis, and moves the run
// into phase p, while no call is in flight.
func (t *timeline) change(p int, action func() error) error {
	t.gate.Lock()
	defer t.gate.Unlock()
	err := action()
	t.mu.Lock()
	t.changes[p] = time.Since(t.start)
	t.mu.Unlock()
	t.phase.Store(int32(p))
	return err
}

// changedAt returns when phase p began, since the start.
func (t *timeline) changedAt(p int) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changes[p]
}

// phaseSpans returns how long each phase lasted, given the run's end.
func (t *timeline) phaseSpans(end time.Duration) [phases]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var spans [phases]time.Duration
	for p := range phases {
		next := end
		for q := p + 1; q < phases; q++ {
			if t.changes[q] > 0 {
				next = t.changes[q]
				break
			}
		}
		if p == 0 || t.changes[p] > 0 {
			spans[p] = next - t.changes[p]
		}
	}
	return spans
}

// record counts one call of strategy s answered in phase p.
func (t *timeline) record(s *series, p int, allowed bool, err error) {
	if p == phaseWarmUp {
		return
	}
	b := min(int(time.Since(t.start)/t.bin), len(s.admitted)-1)
	switch {
	case err != nil:
		s.errs[p].Add(1)
		s.errors[b].Add(1)
		msg := err.Error()
		s.lastErr[p].Store(&msg)
	case allowed:
		s.decisions[p].Add(1)
		s.admits[p].Add(1)
		s.admitted[b].Add(1)
	default:
		s.decisions[p].Add(1)
	}
}

// errText returns the last error recorded in phase p, or "".
func (s *series) errText(p int) string {
	if e := s.lastErr[p].Load(); e != nil {
		return *e
	}
	return ""
}

// pace tick: how often a paced driver wakes up to issue what is due.
const paceTick = 10 * time.Millisecond

// pace offers f's members rate decisions per second in all, on key, until
// ctx is done, and records them in t. A member that falls behind by more
// than a tenth of a second drops the backlog rather than bursting.
func (t *timeline) pace(ctx context.Context, f *fleet, key string, rate float64) {
	s := t.series[f.strategy]
	per := rate / float64(len(f.members))
	var wg sync.WaitGroup
	for _, m := range f.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(paceTick)
			defer tick.Stop()
			start, issued := time.Now(), int64(0)
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				due := int64(time.Since(start).Seconds()*per) - issued
				if lag := max(1, int64(per/10)); due > lag {
					issued += due - lag
					due = lag
				}
				for range due {
					t.gate.RLock()
					res, err := m.AllowN(ctx, key, 1)
					p := int(t.phase.Load())
					t.gate.RUnlock()
					if ctx.Err() != nil {
						return
					}
					t.record(s, p, res.Allowed, err)
					issued++
				}
			}
		}()
	}
	wg.Wait()
}
