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
	logger *slog.Logger                      // nil: slog.Default()
	set    series.Set[[2]prometheus.Counter] // denied, allowed
}

func newLimitSeries(vec *prometheus.CounterVec, name string, max int, logger *slog.Logger) *limitSeries {
	return &limitSeries{name: name, logger: logger, set: series.Set[[2]prometheus.Counter]{
		Max: max,
		New: func(label string) [2]prometheus.Counter {
			return [2]prometheus.Counter{
				vec.WithLabelValues(name, label, "denied"),
				vec.WithLabelValues(name, label, "allowed"),
			}
		},
	}}
}

func (s *limitSeries) count(d tierlimit.Decision) {
	if d.Limit == (tierlimit.Limit{}) {
		return
	}
	c, overflow := s.set.Get(d.Limit)
	if overflow {
		logline.Or(s.logger).Warn("tierlimit: metrics: more distinct limits than WithMaxLimits; later ones are counted as \"other\"",
			slog.String("limiter", s.name), slog.Int("max_limits", s.set.Max))
	}
	if d.Allowed {
		c[1].Inc()
	} else {
		c[0].Inc()
	}
}
