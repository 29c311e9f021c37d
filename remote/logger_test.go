package remote

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLogger checks that the limiter's warnings (here: a server that may
// evict its keys) reach WithLogger's
// logger and nothing reaches the default logger; without WithLogger, the
// default logger has them.
func TestLogger(t *testing.T) {
	rdb := redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru").Client(t)
	for _, withLogger := range []bool{true, false} {
		var own, global bytes.Buffer
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&global, nil)))
		opts := []Option{}
		want, quiet := &own, &global
		if withLogger {
			opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(&own, nil))))
		} else {
			want, quiet = &global, &own
		}
		_, err := NewTokenBucket(rdb, tierlimit.PerSecond(10), opts...)
		slog.SetDefault(prev)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(want.String(), "tierlimit: ") {
			t.Errorf("WithLogger %v: the logger got %q, want the eviction warning", withLogger, want.String())
		}
		if quiet.Len() != 0 {
			t.Errorf("WithLogger %v: the other logger got %q, want nothing", withLogger, quiet.String())
		}
	}
}
