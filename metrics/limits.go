package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit"
)

// DefaultMaxLimits is the number of distinct limits per limiter that
// tierlimit_limit_decisions_total labels, unless WithMaxLimits says
// otherwise.
const DefaultMaxLimits = 32

// otherLimit labels the decisions of the limits beyond the bound.
const otherLimit = "other"

// limitSeries counts one limiter's decisions by the limit that decided
// (tierlimit.Decision.Limit), under a label that names at most max
// distinct limits: a limiter with per-key limits (WithLimitFunc) may see
// many, and a label must stay bounded.
type limitSeries struct {
	vec  *prometheus.CounterVec
	name string
	max  int

	mu   sync.RWMutex
	seen map[tierlimit.Limit][2]prometheus.Counter // denied, allowed
}

func (s *limitSeries) count(d tierlimit.Decision) {
	if d.Limit == (tierlimit.Limit{}) {
		return
	}
	s.mu.RLock()
	c, ok := s.seen[d.Limit]
	s.mu.RUnlock()
	if !ok {
		c = s.add(d.Limit)
	}
	if d.Allowed {
		c[1].Inc()
	} else {
		c[0].Inc()
	}
}

// countGiveBack counts an admission under l whose charge was given back
// (tierlimit.GiveBack), in a series made on the first one: most limiters
// never give back.
func (s *limitSeries) countGiveBack(l tierlimit.Limit) {
	if l == (tierlimit.Limit{}) {
		return
	}
	if !s.known(l) {
		s.add(l) // a label of its own if there is room, as for a decision
	}
	label := otherLimit
	if s.known(l) {
		label = l.String()
	}
	s.vec.WithLabelValues(s.name, label, "given_back").Inc()
}

// known reports whether l has a label of its own.
func (s *limitSeries) known(l tierlimit.Limit) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.seen[l]
	return ok
}

func (s *limitSeries) add(l tierlimit.Limit) [2]prometheus.Counter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.seen[l]; ok {
		return c
	}
	label := otherLimit
	if len(s.seen) < s.max {
		label = l.String()
	}
	c := [2]prometheus.Counter{
		s.vec.WithLabelValues(s.name, label, "denied"),
		s.vec.WithLabelValues(s.name, label, "allowed"),
	}
	if label != otherLimit {
		s.seen[l] = c
	}
	return c
}
