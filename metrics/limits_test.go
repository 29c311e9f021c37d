package metrics

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logtest"
)

// TestDecisionsByLimit counts decisions by the limit that decided, up to
// WithMaxLimits limits, then under "other"; a decision without a limit is
// not counted there.
func TestDecisionsByLimit(t *testing.T) {
	c := mustNew(t, WithMaxLimits(2))
	o := c.Observer("api")
	free, pro, team := tierlimit.PerSecond(10), tierlimit.PerSecond(100), tierlimit.PerMinute(5000).WithBurst(200)
	for _, d := range []tierlimit.Decision{
		{Allowed: true, Limit: free},
		{Allowed: false, Limit: free},
		{Allowed: true, Limit: pro},
		{Allowed: true, Limit: team}, // a third limit: "other"
		{Allowed: false, Limit: team},
		{Allowed: true}, // no limit: not labelled
	} {
		o.Decision(d)
	}
	want := `
# HELP tierlimit_limit_decisions_total Decisions made, by the limit that decided them (a key's own, with per-key limits) and their result.
# TYPE tierlimit_limit_decisions_total counter
tierlimit_limit_decisions_total{limit="10/1s",limiter="api",result="allowed"} 1
tierlimit_limit_decisions_total{limit="10/1s",limiter="api",result="denied"} 1
tierlimit_limit_decisions_total{limit="100/1s",limiter="api",result="allowed"} 1
tierlimit_limit_decisions_total{limit="100/1s",limiter="api",result="denied"} 0
tierlimit_limit_decisions_total{limit="other",limiter="api",result="allowed"} 1
tierlimit_limit_decisions_total{limit="other",limiter="api",result="denied"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "tierlimit_limit_decisions_total"); err != nil {
		t.Error(err)
	}
	if _, err := New(WithMaxLimits(-1)); err == nil {
		t.Error("New(WithMaxLimits(-1)) = nil error, want ErrInvalidOption")
	}
	if _, err := New(WithMaxLimits(maxMaxLimits + 1)); err == nil {
		t.Error("New(WithMaxLimits(1025)) = nil error, want ErrInvalidOption")
	}
}

// TestLogger checks that the bound of WithMaxLimits, once reached, is
// logged once per limiter to WithLogger's logger and nothing reaches the
// default logger; without WithLogger, the default logger has it.
func TestLogger(t *testing.T) {
	logtest.Check(t, 1, []string{"level=WARN", "limiter=api", "max_limits=1"}, func(logger *slog.Logger) {
		opts := []Option{WithMaxLimits(1)}
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		o := mustNew(t, opts...).Observer("api")
		for r := int64(1); r <= 5; r++ {
			o.Decision(tierlimit.Decision{Allowed: true, Limit: tierlimit.PerSecond(r)})
		}
	})
}
