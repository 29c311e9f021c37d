package hybrid

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
		l, err := New(rdb, tierlimit.PerSecond(10), opts...)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	})
}

// TestLoggerBreaker: an outage logs two lines through WithLogger's logger
// (and none to the default logger), whatever the number of probes: a
// warning when the breaker opens, a line when Redis answers again and it
// closes. Real redis-server, SIGSTOP, go-redis's default client.
func TestLoggerBreaker(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	ctx := context.Background()
	logtest.Check(t, 2, []string{"hybrid: Redis", "circuit breaker", "prefix=tierlimit:"}, func(logger *slog.Logger) {
		var opts []Option
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		l, err := New(rdb, tierlimit.PerSecond(1000), opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		await := func(want tierlimit.BreakerState) {
			t.Helper()
			for deadline := time.Now().Add(15 * time.Second); l.Stats().Breaker != want; time.Sleep(10 * time.Millisecond) {
				if _, err := l.Allow(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("breaker %v after 15 s, want %v: %+v", l.Stats().Breaker, want, l.Stats())
				}
			}
		}
		s.Pause()
		await(tierlimit.BreakerOpen)
		time.Sleep(3 * DefaultProbeInterval) // probes that fail: debug lines only
		s.Resume()
		await(tierlimit.BreakerClosed)
	})
}
