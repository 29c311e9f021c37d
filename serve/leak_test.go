package serve

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestCloseLeavesNoGoroutine checks that Close stops what New and the
// decisions started on every tier: once the server and its Redis client
// are closed, the goroutines are those of before.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before := runtime.NumGoroutine()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	cfg := mustParse(t, serverConfig)
	s, err := New(cfg, rdb, patient)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"hourly", "window", "gcra", "own", "sliding"} {
		if _, err := s.ShouldRateLimit(ctx, request("test", desc(key, "x"))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
