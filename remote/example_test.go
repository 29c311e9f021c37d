package remote_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/remote"
)

// stepClock is a client clock the examples step by hand, so that they
// print the same on every run.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

// redisForExample starts an in-memory Redis for the examples; use your own
// *redis.Client or *redis.ClusterClient.
func redisForExample() (*redis.Client, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return rdb, func() { rdb.Close(); m.Close() }
}

// Tenants on plans: one limiter, each key at its plan's limit. A plan
// upgrade keeps the key's state: a drained key is not refilled by it.
func ExampleWithLimitFunc() {
	rdb, done := redisForExample()
	defer done()
	ctx := context.Background()
	clock := &stepClock{t: time.Unix(1_700_000_000, 0)}
	plans := map[string]tierlimit.Limit{"acme": tierlimit.PerSecond(100)}
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(10), // the default plan
		remote.WithClientClock(clock),
		remote.WithLimitFunc(func(key string) tierlimit.Limit { return plans[key] }))
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"acme", "initech"} {
		r, _ := lim.AllowN(ctx, key, 0)
		fmt.Printf("%s: %d of %v\n", key, r.Remaining, r.Limit)
	}
	lim.AllowN(ctx, "initech", 10)               // drained
	plans["initech"] = tierlimit.PerSecond(1000) // upgraded (set before any concurrent use in real code)
	r, _ := lim.AllowN(ctx, "initech", 0)
	fmt.Printf("initech upgraded: %d of %v\n", r.Remaining, r.Limit)
	clock.t = clock.t.Add(10 * time.Millisecond)
	r, _ = lim.AllowN(ctx, "initech", 0)
	fmt.Printf("10 ms later: %d\n", r.Remaining)
	// Output:
	// acme: 100 of 100/1s
	// initech: 10 of 10/1s
	// initech upgraded: 0 of 1000/1s
	// 10 ms later: 10
}

// A user's request counts against the user's limit and the user's
// organization's: both or neither.
func ExampleTokenBucket_AllowAll() {
	rdb, done := redisForExample()
	defer done()
	ctx := context.Background()
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerMinute(3), remote.WithClientClock(&stepClock{t: time.Unix(1_700_000_000, 0)}),
		remote.WithLimitFunc(func(key string) tierlimit.Limit {
			if key == "org:7" {
				return tierlimit.PerMinute(4)
			}
			return tierlimit.Limit{}
		}))
	if err != nil {
		panic(err)
	}
	for _, user := range []string{"user:1", "user:1", "user:1", "user:2", "user:2"} {
		r, _ := lim.AllowAll(ctx, tierlimit.Take{Key: user, N: 1}, tierlimit.Take{Key: "org:7", N: 1})
		fmt.Println(user, r.Allowed)
	}
	r, _ := lim.AllowN(ctx, "user:2", 0)
	fmt.Println("user:2 has", r.Remaining, "left: the refusal charged nothing")
	// Output:
	// user:1 true
	// user:1 true
	// user:1 true
	// user:2 true
	// user:2 false
	// user:2 has 2 left: the refusal charged nothing
}

// Wait for the limit rather than refuse, but not past the context's
// deadline.
func ExampleTokenBucket_WaitN() {
	rdb, done := redisForExample()
	defer done()
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(1))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	r, err := lim.WaitN(ctx, "job", 1)
	fmt.Println(r.Allowed, err)
	_, err = lim.WaitN(ctx, "job", 1) // the next token comes in a second
	fmt.Println(errors.Is(err, tierlimit.ErrWaitDeadline))
	// Output:
	// true <nil>
	// true
}

// Charge an LLM request its estimated tokens, then settle to what it used.
func ExampleTokenBucket_Settle() {
	rdb, done := redisForExample()
	defer done()
	ctx := context.Background()
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerMinute(10_000),
		remote.WithClientClock(&stepClock{t: time.Unix(1_700_000_000, 0)}))
	if err != nil {
		panic(err)
	}
	const estimate = 4000
	r, _ := lim.AllowN(ctx, "tenant:9", estimate)
	fmt.Println("after the estimate:", r.Remaining)
	used := int64(1500) // from the response
	r, _ = lim.Settle(ctx, "tenant:9", estimate, used)
	fmt.Println("after settling:", r.Remaining)
	// Output:
	// after the estimate: 6000
	// after settling: 8500
}

// A request that used more than the key had left puts the key in debt: it
// is denied until the rate has repaid it, and told exactly how long.
func ExampleTokenBucket_Settle_debt() {
	rdb, done := redisForExample()
	defer done()
	ctx := context.Background()
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerMinute(10_000),
		remote.WithClientClock(&stepClock{t: time.Unix(1_700_000_000, 0)}))
	if err != nil {
		panic(err)
	}
	lim.AllowN(ctx, "tenant:9", 9000)                 // a request's estimate
	lim.AllowN(ctx, "tenant:9", 1000)                 // another's: the key is empty
	r, _ := lim.Settle(ctx, "tenant:9", 9000, 10_000) // the first used 1000 more
	fmt.Println("after settling:", r.Remaining, r.ResetAfter)
	r, _ = lim.AllowN(ctx, "tenant:9", 500)
	fmt.Println(r.Allowed, r.RetryAfter) // 1000 in debt, then 500
	// Output:
	// after settling: 0 1m6s
	// false 9s
}

// A batch consumer takes up to 100 messages, as many as the key holds.
func ExampleTokenBucket_AllowAtMost() {
	rdb, done := redisForExample()
	defer done()
	ctx := context.Background()
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(10).WithBurst(150),
		remote.WithClientClock(&stepClock{t: time.Unix(1_700_000_000, 0)}))
	if err != nil {
		panic(err)
	}
	for range 3 {
		n, r, _ := lim.AllowAtMost(ctx, "queue:7", 100)
		fmt.Println(n, r.Remaining, r.RetryAfter)
	}
	// Output:
	// 100 50 0s
	// 50 0 0s
	// 0 0 100ms
}

// ExampleSlogLogger routes go-redis's own log lines, such as the one of
// each failed dial while Redis is down, into the service's slog.Logger.
func ExampleSlogLogger() {
	// The service's logger: here text on standard output, without the time.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	// Once, in main, before any client is made: go-redis has one logger.
	redis.SetLogger(remote.SlogLogger{Logger: logger})
	defer redis.SetLogger(remote.SlogLogger{}) // this example only: back to slog.Default()

	// A Redis nobody listens on: one dial, one line.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	_ = rdb.Ping(context.Background()).Err()
	// Output:
	// level=WARN msg="redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:1: connect: connection refused" logger=go-redis
}
