package metrics

import (
	"fmt"
	"log/slog"
	"math"
	"regexp"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/series"
)

// DefaultNamespace begins every metric name, unless WithNamespace says
// otherwise.
const DefaultNamespace = "tierlimit"

// Option configures a Collector.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	namespace       string
	decisionBuckets []float64
	redisBuckets    []float64
	maxLimits       int
	logger          *slog.Logger
}

// defaults returns the default options; the histogram buckets, in
// seconds, are series.DecisionBuckets and series.RedisBuckets.
func defaults() config {
	return config{
		namespace:       DefaultNamespace,
		decisionBuckets: series.DecisionBuckets(),
		redisBuckets:    series.RedisBuckets(),
		maxLimits:       DefaultMaxLimits,
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: metrics: "+format, append([]any{tierlimit.ErrInvalidOption}, args...)...)
}

var namespaceRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// WithNamespace sets the prefix of every metric name (default
// DefaultNamespace): a Prometheus name part, letters, digits and '_', not
// starting with a digit.
func WithNamespace(ns string) Option {
	return optionFunc(func(c *config) error {
		if !namespaceRE.MatchString(ns) {
			return invalid("namespace %q is not a Prometheus name", ns)
		}
		c.namespace = ns
		return nil
	})
}

// WithDecisionBuckets sets the upper bounds, in seconds, of the decision
// latency histogram's buckets (default 1 µs, 10 µs, 100 µs, 250 µs,
// 500 µs, 1 ms, 2.5 ms, 5 ms, 10 ms, 25 ms, 100 ms): finite, positive and
// increasing.
func WithDecisionBuckets(bounds ...float64) Option {
	return optionFunc(func(c *config) error {
		if err := checkBuckets(bounds); err != nil {
			return err
		}
		c.decisionBuckets = append([]float64(nil), bounds...)
		return nil
	})
}

// WithRedisBuckets sets the upper bounds, in seconds, of the Redis call
// latency histogram's buckets (default 100 µs, 250 µs, 500 µs, 1 ms,
// 2.5 ms, 5 ms, 10 ms, 25 ms, 50 ms, 100 ms, 250 ms, 1 s), as for
// WithDecisionBuckets.
func WithRedisBuckets(bounds ...float64) Option {
	return optionFunc(func(c *config) error {
		if err := checkBuckets(bounds); err != nil {
			return err
		}
		c.redisBuckets = append([]float64(nil), bounds...)
		return nil
	})
}

// maxMaxLimits bounds WithMaxLimits: every labelled limit is a series per
// result and limiter.
const maxMaxLimits = series.MaxMaxLimits

// WithMaxLimits sets how many distinct limits per limiter
// tierlimit_limit_decisions_total names (default DefaultMaxLimits, at most
// 1024): the decisions of later ones are counted under limit="other".
func WithMaxLimits(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n > maxMaxLimits {
			return invalid("max limits %d must be between 0 and %d", n, maxMaxLimits)
		}
		c.maxLimits = n
		return nil
	})
}

func checkBuckets(b []float64) error {
	if len(b) == 0 {
		return invalid("no buckets")
	}
	for i, v := range b {
		if v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) || (i > 0 && v <= b[i-1]) {
			return invalid("buckets %v must be finite, positive and increasing", b)
		}
	}
	return nil
}

// WithLogger sets the logger a Collector warns in (default: slog.Default(),
// read when a line is logged): once per limiter, when it sees more
// distinct limits than WithMaxLimits labels.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	})
}
