package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logline"
	"github.com/tierlimit/tierlimit/internal/series"
)

// DefaultMaxLimits is the number of distinct limits per limiter that
// tierlimit_limit_decisions_total labels, unless WithMaxLimits says
// otherwise.
const DefaultMaxLimits = series.DefaultMaxLimits

// limitSeries counts one limiter's decisions by the limit that decided
// (tierlimit.Decision.Limit), under a label that names at most max
// distinct limits, then "other": a limiter with per-key limits
// (WithLimitFunc) may see many, and a label must stay bounded.
type limitSeries struct {
	name   string
	vec    *prometheus.CounterVec
	logger *slog.Logger // nil: slog.Default()
	set    series.Set[limitCounters]
}

// limitCounters are one label's counters.
type limitCounters struct {
	label           string
	denied, allowed prometheus.Counter
}

func newLimitSeries(vec *prometheus.CounterVec, name string, max int, logger *slog.Logger) *limitSeries {
	return &limitSeries{name: name, vec: vec, logger: logger, set: series.Set[limitCounters]{
		Max: max,
		New: func(label string) limitCounters {
			return limitCounters{
				label:   label,
				denied:  vec.WithLabelValues(name, label, "denied"),
				allowed: vec.WithLabelValues(name, label, "allowed"),
			}
		},
	}}
}

// get returns l's counters, and says once when the labels overflow.
func (s *limitSeries) get(l tierlimit.Limit) limitCounters {
	c, overflow := s.set.Get(l)
	if overflow {
		logline.Or(s.logger).Warn("tierlimit: metrics: more distinct limits than WithMaxLimits; later ones are counted as \"other\"",
			slog.String("limiter", s.name), slog.Int("max_limits", s.set.Max))
	}
	return c
}

func (s *limitSeries) count(d tierlimit.Decision) {
	if d.Limit == (tierlimit.Limit{}) {
		return
	}
	c := s.get(d.Limit)
	if d.Allowed {
		c.allowed.Inc()
	} else {
		c.denied.Inc()
	}
}

// countGiveBack counts an admission under l whose charge was given back
// (tierlimit.GiveBack), in a series made on the first one: most limiters
// never give back.
func (s *limitSeries) countGiveBack(l tierlimit.Limit) {
	if l == (tierlimit.Limit{}) {
		return
	}
	s.vec.WithLabelValues(s.name, s.get(l).label, "given_back").Inc()
}
