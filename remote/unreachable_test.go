package remote

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestNewUnreachable: every constructor, given a client of a loopback port
// where nothing listens and go-redis's default options, returns a limiter
// within NewTimeout (and the scheduling slack of a busy machine), and logs
// one line saying in plain words that Redis did not answer, where, and
// what happens next.
func TestNewUnreachable(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	const slack = NewTimeout // a loaded 2-core machine's scheduling delay, at most
	for _, alg := range algorithms {
		logged.Reset()
		start := time.Now()
		d, err := alg.new(rdb, tierlimit.PerSecond(10))
		took := time.Since(start)
		if err != nil || d == nil {
			t.Errorf("%s: New on an unreachable Redis = %v, %v; want a limiter, nil", alg.name, d, err)
		}
		if took > NewTimeout+slack {
			t.Errorf("%s: New on an unreachable Redis took %v, want at most %v", alg.name, took, NewTimeout+slack)
		}
		line := logged.String()
		for _, want := range []string{"redis at " + addr + " did not answer", "the limiter is made anyway"} {
			if !strings.Contains(line, want) {
				t.Errorf("%s: New logged %q, want it to say %q", alg.name, line, want)
			}
		}
		if strings.Count(line, "\n") != 1 {
			t.Errorf("%s: New logged %d lines, want 1: %q", alg.name, strings.Count(line, "\n"), line)
		}
	}
}
