// Command quickstart shows the hybrid tier next to the remote token bucket:
// three simulated instances, each with its own Redis client, share one
// limit on a hot key for a few seconds. It prints what each strategy
// admitted against the bucket's bound, and how many Redis calls it made per
// 1000 decisions.
//
// It runs on an embedded Redis (miniredis, in process, on loopback) unless
// -redis names a real one:
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -redis redis://127.0.0.1:6379/0 -duration 5s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/remote"
)

func main() {
	url := flag.String("redis", "", "Redis URL (default: an embedded Redis)")
	duration := flag.Duration("duration", 3*time.Second, "how long each strategy runs")
	rate := flag.Int64("rate", 1000, "limit: events per second for the hot key")
	flag.Parse()
	if err := run(*url, *duration, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

const (
	instances  = 3
	goroutines = 8
)

func run(url string, duration time.Duration, rate int64) error {
	if duration <= 0 || duration > time.Hour {
		return fmt.Errorf("-duration %v must be between 0 and 1h", duration)
	}
	limit := tierlimit.PerSecond(rate)
	if err := limit.Validate(); err != nil {
		return err
	}
	opts, stop, err := redisOptions(url)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("limit %v per key, %d instances × %d goroutines, %v each\n\n", limit, instances, goroutines, duration)
	fmt.Printf("%-14s %12s %10s %10s %8s %18s\n", "strategy", "decisions/s", "admitted", "bound", "%bound", "Redis calls/1000")
	for _, s := range []string{"remote", "hybrid"} {
		r, err := fleet(opts, s, limit, duration)
		if err != nil {
			return err
		}
		bound := limit.Capacity() + int64(float64(rate)*r.elapsed.Seconds())
		fmt.Printf("%-14s %12.0f %10d %10d %7.1f%% %18.1f\n", s, float64(r.decisions)/r.elapsed.Seconds(),
			r.admitted, bound, 100*float64(r.admitted)/float64(bound), 1000*float64(r.calls)/float64(r.decisions))
	}
	return nil
}

// redisOptions returns client options for url, or starts an embedded Redis.
func redisOptions(url string) (*redis.Options, func(), error) {
	if url != "" {
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		return o, func() {}, nil
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, nil, err
	}
	return &redis.Options{Addr: m.Addr()}, m.Close, nil
}

type outcome struct {
	decisions, admitted, calls int64
	elapsed                    time.Duration
}

// fleet runs one strategy: instances limiters, each with its own client,
// hammering one fresh hot key.
func fleet(opts *redis.Options, strategy string, limit tierlimit.Limit, d time.Duration) (outcome, error) {
	key := fmt.Sprintf("hot-%s-%d", strategy, time.Now().UnixNano())
	var out outcome
	var decisions, admitted atomic.Int64
	calls := &callcount.Hook{}
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	errs := make(chan error, instances*goroutines)
	for i := 0; i < instances; i++ {
		rdb := redis.NewClient(opts)
		rdb.AddHook(calls)
		defer rdb.Close()
		var lim tierlimit.Limiter
		var closeFn func() error
		switch strategy {
		case "remote":
			b, err := remote.NewTokenBucket(rdb, limit)
			if err != nil {
				return out, err
			}
			lim, closeFn = b, func() error { return nil }
		default:
			h, err := hybrid.New(rdb, limit)
			if err != nil {
				return out, err
			}
			lim, closeFn = h, h.Close
		}
		defer closeFn()
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					r, err := lim.AllowN(context.Background(), key, 1)
					if err != nil {
						errs <- err
						return
					}
					decisions.Add(1)
					if r.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return out, err
	}
	return outcome{decisions.Load(), admitted.Load(), calls.Calls(), time.Since(start)}, nil
}
