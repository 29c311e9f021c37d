package grpclimit

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestLogger checks that limiter errors, without WithErrorFunc, reach
// WithLogger's logger at most once per interval and nothing reaches the
// default logger; without WithLogger, the default logger has them.
func TestLogger(t *testing.T) {
	for _, withLogger := range []bool{true, false} {
		var own, global bytes.Buffer
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&global, nil)))
		opts := []Option{WithKey(KeyMethod)}
		want, quiet := &own, &global
		if withLogger {
			opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(&own, nil))))
		} else {
			want, quiet = &global, &own
		}
		cc := serve(t, interceptors(mustNew(t, failing{}, opts...)))
		for i := 0; i < 20; i++ {
			if err := unary(testCtx(t), cc); err != nil {
				t.Fatalf("call %d: %v, want served (fail open)", i, err)
			}
		}
		slog.SetDefault(prev)
		got := want.String()
		if n := strings.Count(got, "\n"); n != 1 || !strings.Contains(got, "failing=open") || !strings.Contains(got, errDown.Error()) {
			t.Errorf("WithLogger %v: logged %q, want one line with the policy and the error", withLogger, got)
		}
		if quiet.Len() != 0 {
			t.Errorf("WithLogger %v: the other logger got %q, want nothing", withLogger, quiet.String())
		}
	}
}
