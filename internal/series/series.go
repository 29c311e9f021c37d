// Package series holds what the exporters of limiter metrics share, the
// Prometheus collector (package metrics) and the OpenTelemetry bridge:
// the default histogram bounds, and a Set that labels decisions by the
// limit that decided them under a bounded set of labels (a limiter with
// per-key limits may see any number of limits, and a metric's label
// values must stay few).
package series

import (
	"sync"

	"github.com/tierlimit/tierlimit"
)

// DecisionBuckets returns the default bounds, in seconds, of decision
// latency histograms. A decision from a lease or an in-process limiter
// waits on nothing and falls in the lowest bucket; one that waits on Redis
// takes a round trip, on loopback or across a network: the bounds span
// 1 µs to 100 ms.
func DecisionBuckets() []float64 {
	return []float64{1e-6, 1e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1}
}

// RedisBuckets returns the default bounds, in seconds, of Redis call
// latency histograms: 100 µs to 1 s.
func RedisBuckets() []float64 {
	return []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1}
}

// DefaultMaxLimits is the number of distinct limits per limiter labelled
// by default.
const DefaultMaxLimits = 32

// MaxMaxLimits bounds the number of distinct limits per limiter labelled:
// every labelled limit is a series per result and limiter.
const MaxMaxLimits = 1024

// Other labels the decisions of the limits beyond the bound.
const Other = "other"

// Set maps the first Max distinct limits it sees to series of their own,
// made by New with the limit's String, and every later one to the series
// made with Other. A Set is safe for concurrent use and must not be
// copied after first use; New is called at most once per label, under the
// Set's lock, and must not call back into the Set.
type Set[T any] struct {
	Max int
	New func(label string) T

	mu       sync.RWMutex
	seen     map[tierlimit.Limit]T
	other    T
	hasOther bool
}

// Get returns the series of l. overflow is true once per Set, for the
// first limit past the bound, so that the caller may say so (outside any
// lock of its own).
func (s *Set[T]) Get(l tierlimit.Limit) (series T, overflow bool) {
	s.mu.RLock()
	series, ok := s.seen[l]
	if !ok && s.hasOther && len(s.seen) >= s.Max {
		series, ok = s.other, true
	}
	s.mu.RUnlock()
	if ok {
		return series, false
	}
	return s.add(l)
}

// Range calls f with each label and its series, Other's last if made,
// outside the Set's lock: f may take its time.
func (s *Set[T]) Range(f func(label string, series T)) {
	type entry struct {
		label  string
		series T
	}
	s.mu.RLock()
	all := make([]entry, 0, len(s.seen)+1)
	for l, series := range s.seen {
		all = append(all, entry{l.String(), series})
	}
	if s.hasOther {
		all = append(all, entry{Other, s.other})
	}
	s.mu.RUnlock()
	for _, e := range all {
		f(e.label, e.series)
	}
}

func (s *Set[T]) add(l tierlimit.Limit) (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if series, ok := s.seen[l]; ok {
		return series, false
	}
	if len(s.seen) < s.Max {
		if s.seen == nil {
			s.seen = map[tierlimit.Limit]T{}
		}
		series := s.New(l.String())
		s.seen[l] = series
		return series, false
	}
	if s.hasOther {
		return s.other, false
	}
	s.other, s.hasOther = s.New(Other), true
	return s.other, true
}
