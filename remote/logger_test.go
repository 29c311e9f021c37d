package remote

import (
	"context"
	"log/slog"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logtest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLogger checks that the limiter's warnings (here: a server that may
// evict its keys) reach WithLogger's logger and nothing reaches the
// default logger; without WithLogger, the default logger has them.
func TestLogger(t *testing.T) {
	rdb := redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru").Client(t)
	logtest.Check(t, 1, []string{"level=WARN", "tierlimit: ", "allkeys-lru"}, func(logger *slog.Logger) {
		var opts []Option
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		_, err := NewTokenBucket(rdb, tierlimit.PerSecond(10), opts...)
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestSlogLogger: a go-redis line reaches SlogLogger's Logger, or
// slog.Default() without one, as a warning, and nothing else does.
func TestSlogLogger(t *testing.T) {
	logtest.Check(t, 1, []string{"level=WARN", `msg="redis: failed to dial after 3 attempts"`, "logger=go-redis"}, func(logger *slog.Logger) {
		SlogLogger{Logger: logger}.Printf(context.Background(), "redis: failed to dial after %d attempts\n", 3)
	})
}
