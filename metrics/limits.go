package metrics

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logline"
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
	vec    *prometheus.CounterVec
	name   string
	max    int
	logger *slog.Logger // nil: slog.Default()

	mu     sync.RWMutex
	seen   map[tierlimit.Limit][2]prometheus.Counter // denied, allowed
	warned bool                                      // the bound was reached and logged
}

func (s *limitSeries) count(d tierlimit.Decision) {
	if d.Limit == (tierlimit.Limit{}) {
		return
	}
	s.mu.RLock()
	c, ok := s.seen[d.Limit]
	s.mu.RUnlock()
	if !ok {
		var warn bool
		if c, warn = s.add(d.Limit); warn {
			// Logged outside the lock: a logger is the caller's code.
			logline.Or(s.logger).Warn("tierlimit: metrics: more distinct limits than WithMaxLimits; later ones are counted as \"other\"",
				slog.String("limiter", s.name), slog.Int("max_limits", s.max))
		}
	}
	if d.Allowed {
		c[1].Inc()
	} else {
		c[0].Inc()
	}
}

// add returns the counters of l, made on first sight; warn is true for
// the first limit past the bound, once per limiter.
func (s *limitSeries) add(l tierlimit.Limit) (c [2]prometheus.Counter, warn bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.seen[l]; ok {
		return c, false
	}
	label := otherLimit
	if len(s.seen) < s.max {
		label = l.String()
	}
	c = [2]prometheus.Counter{
		s.vec.WithLabelValues(s.name, label, "denied"),
		s.vec.WithLabelValues(s.name, label, "allowed"),
	}
	if label != otherLimit {
		s.seen[l] = c
		return c, false
	}
	warn = !s.warned
	s.warned = true
	return c, warn
}
