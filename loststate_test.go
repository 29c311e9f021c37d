package tierlimit_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLostState is G1 when Redis loses a key's state while the fleet holds
// leases on it: FLUSHALL every second, a restart from empty (SIGKILL, no
// persistence) and a Redis at maxmemory under allkeys-lru that evicts the
// hot key as other keys keep arriving (200-byte values, maxmemory a little
// above what the server uses empty). Each under 3 instances × 8 callers on
// a saturated 1000/s key, with default options and go-redis's default
// client: the fleet admits at most 1.02× one bucket over the run after
// flushes and restarts, at most 1.2× under eviction, and no caller sees an
// error.
func TestLostState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three 6 s fleets")
	}
	const run = 6 * time.Second
	faults := []struct {
		name  string
		bound float64
		// start begins the fault on s; stop ends it (and waits for it).
		start func(t *testing.T, s *redistest.Server) (stop func())
	}{
		{"flushall", 1.02, func(t *testing.T, s *redistest.Server) func() {
			return every(t, time.Second, func() error { return s.Client(t).FlushAll(context.Background()).Err() })
		}},
		{"restart empty", 1.02, func(t *testing.T, s *redistest.Server) func() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				time.Sleep(2 * time.Second)
				s.Restart(t) // SIGKILL, then started again without its data
			}()
			return func() { <-done }
		}},
		{"allkeys-lru at maxmemory", 1.2, func(t *testing.T, s *redistest.Server) func() {
			admin := s.Client(t)
			ctx := context.Background()
			used, err := admin.Info(ctx, "memory").Result()
			if err != nil {
				t.Fatal(err)
			}
			max := infoField(t, used, "used_memory") + 256<<10
			if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				t.Fatal(err)
			}
			if err := admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(max, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			value := strings.Repeat("v", 200)
			var n atomic.Int64
			return every(t, time.Millisecond, func() error {
				for range 20 {
					if err := admin.Set(ctx, "filler:"+strconv.FormatInt(n.Add(1), 10), value, 0).Err(); err != nil &&
						!strings.HasPrefix(err.Error(), "OOM ") {
						return err
					}
				}
				return nil
			})
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t)
			limit := tierlimit.PerSecond(1000)
			limiters := make([]*hybrid.Limiter, 3)
			for i := range limiters {
				l, err := hybrid.New(defaultClient(t, s), limit)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				limiters[i] = l
			}
			var admitted, errs atomic.Int64
			var firstErr atomic.Value
			start := time.Now()
			var last atomic.Int64
			var wg sync.WaitGroup
			for _, l := range limiters {
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Since(start) < run {
							r, err := l.Allow(context.Background(), "hot")
							switch {
							case err != nil:
								errs.Add(1)
								firstErr.CompareAndSwap(nil, err.Error())
							case r.Allowed:
								admitted.Add(1)
								last.Store(time.Now().UnixNano())
							}
							runtime.Gosched() // a request handler's pace: it yields
						}
					}()
				}
			}
			time.Sleep(500 * time.Millisecond) // leases are held
			stop := f.start(t, s)
			wg.Wait()
			stop()
			bound := bucketBound(limit, start, time.Unix(0, last.Load()))
			ratio := float64(admitted.Load()) / float64(bound)
			var opens, lost int64
			for _, l := range limiters {
				st := l.Stats()
				opens += st.BreakerOpens
				lost += st.Lost
			}
			t.Logf("%d admitted, %.3f× one bucket (%d); %d caller errors (first: %v); %d breaker openings",
				admitted.Load(), ratio, bound, errs.Load(), firstErr.Load(), opens)
			if ratio > f.bound {
				t.Errorf("G1: the fleet admitted %.3f× one bucket, want at most %.2f×", ratio, f.bound)
			}
			if errs.Load() != 0 {
				t.Errorf("%d errors reached callers, want 0 (first: %v)", errs.Load(), firstErr.Load())
			}
		})
	}
}

// every calls f every d on a goroutine of its own until the returned stop
// is called; an error of f fails t.
func every(t *testing.T, d time.Duration, f func() error) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := f(); err != nil {
					t.Error(fmt.Errorf("fault: %w", err))
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// TestOOMUnderEvictionIsNoError: a Redis whose maxmemory-policy evicts keys
// but that cannot free enough answers the scripts with OOM. That is memory
// pressure, not a misconfiguration: hybrid.New succeeds, and no caller gets
// an error (the breaker counts the failures, the fallback decides).
// Under noeviction the same reply is ErrMisconfigured
// (TestMisconfigurationMatrix).
func TestOOMUnderEvictionIsNoError(t *testing.T) {
	s := redistest.Start(t)
	admin := s.Client(t)
	ctx := context.Background()
	for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-lru"}, {"maxmemory", "1"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l, err := hybrid.New(defaultClient(t, s), tierlimit.PerSecond(1000))
	if err != nil {
		t.Fatalf("New on a full Redis under allkeys-lru = %v, want a limiter", err)
	}
	defer l.Close()
	for i := range 200 {
		if _, err := l.Allow(ctx, "k"+strconv.Itoa(i%10)); err != nil {
			t.Fatalf("Allow %d on a full Redis under allkeys-lru = %v, want a decision", i, err)
		}
	}
	st := l.Stats()
	t.Logf("stats %+v", st)
	if st.RedisErrors == 0 {
		t.Errorf("no Redis call failed on a Redis that refuses every write: the test did not reach OOM")
	}
}
