package otelbridge

import (
	"fmt"
	"log/slog"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/series"
)

// Defaults of the options.
const (
	// DefaultMaxLimits is the number of distinct limits per limiter that
	// tierlimit.rate_limiting.limit_decisions names, unless WithMaxLimits
	// says otherwise: metrics.DefaultMaxLimits.
	DefaultMaxLimits = series.DefaultMaxLimits
	// ScopeName is the instrumentation scope of the Meter the bridge gets
	// from its MeterProvider.
	ScopeName = "github.com/tierlimit/tierlimit/metrics/otelbridge"
)

// Option configures a Bridge.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	maxLimits    int
	allDurations bool
	logger       *slog.Logger
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("otelbridge: %w: "+format, append([]any{tierlimit.ErrInvalidOption}, args...)...)
}

// WithMaxLimits sets how many distinct limits per limiter
// tierlimit.rate_limiting.limit_decisions names (default
// DefaultMaxLimits, at most 1024): the decisions of later ones are counted
// under tierlimit.rate_limiting.limit="other".
func WithMaxLimits(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n > series.MaxMaxLimits {
			return invalid("max limits %d must be between 0 and %d", n, series.MaxMaxLimits)
		}
		c.maxLimits = n
		return nil
	})
}

// WithLogger sets the logger a Bridge warns in (default: slog.Default(),
// read when a line is logged): once per limiter, when it sees more
// distinct limits than WithMaxLimits names.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	})
}

// WithAllDurations records the duration of every decision in
// tierlimit.rate_limiting.decision.duration, the in-process ones too
// (sources local, blocked and fallback), at the cost of a histogram
// measurement on each. By default only the decisions that waited on Redis
// (source remote) are recorded.
func WithAllDurations() Option {
	return optionFunc(func(c *config) error {
		c.allDurations = true
		return nil
	})
}
