package hybrid

// The stall clock: how long the limiter kept its callers waiting on Redis.

import "sync"

// stalls measures the time during which at least one caller of AllowN or
// AllowAtMost waited on a claim, in total since New. size discounts it
// from the time a key's demand was measured over: a caller that waits on
// Redis asks for nothing meanwhile, so a loop over many keys that each
// claim (a cold start, a slow spell) would otherwise measure the demand
// its own round trips held back, lease that little, and claim again at
// each call (the slow state). It is safe for concurrent use.
type stalls struct {
	mu      sync.Mutex
	waiting int   // callers waiting now
	since   int64 // ns: when waiting became nonzero
	total   int64 // ns waited before since
}

// begin records a caller starting to wait at now.
func (s *stalls) begin(now int64) {
	s.mu.Lock()
	if s.waiting == 0 {
		s.since = now
	}
	s.waiting++
	s.mu.Unlock()
}

// end records a caller, which began to wait, done at now.
func (s *stalls) end(now int64) {
	s.mu.Lock()
	s.waiting--
	if s.waiting == 0 && now > s.since {
		s.total += now - s.since
	}
	s.mu.Unlock()
}

// at returns the time waited in total up to now.
func (s *stalls) at(now int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting > 0 && now > s.since {
		return s.total + now - s.since
	}
	return s.total
}

// stallShare bounds the discount: the time a key's demand is measured over
// is at least 1/stallShare of the time since its last claim. With callers
// on many goroutines, some may wait while others decide: the clock then
// counts time in which demand was still measured, and the bound keeps such
// a key's demand from being overestimated more than stallShare times.
const stallShare = 16

// active returns how much of the time from a key's last claim, at last
// with the stall clock reading stalledThen, to now its callers were not
// kept waiting on Redis (see stalls), at least 1/stallShare of it.
func (l *limiter) active(last, stalledThen, now int64) int64 {
	elapsed := now - last
	return max(elapsed-(l.stalled.at(now)-stalledThen), elapsed/stallShare, 1)
}
