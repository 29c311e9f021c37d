package grpclimit

import (
	"log/slog"
	"testing"

	"github.com/tierlimit/tierlimit/internal/logtest"
)

// TestLogger checks that limiter errors, without WithErrorFunc, reach
// WithLogger's logger at most once per interval and nothing reaches the
// default logger; without WithLogger, the default logger has them.
func TestLogger(t *testing.T) {
	logtest.Check(t, 1, []string{"level=WARN", "failing=open", errDown.Error()}, func(logger *slog.Logger) {
		opts := []Option{WithKey(KeyMethod)}
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		cc := serve(t, interceptors(mustNew(t, failing{}, opts...)))
		for i := 0; i < 20; i++ {
			if err := unary(testCtx(t), cc); err != nil {
				t.Fatalf("call %d: %v, want served (fail open)", i, err)
			}
		}
	})
}
