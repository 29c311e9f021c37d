package hybrid_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
)

// exampleBudget gives the examples' Redis calls a second: miniredis runs the
// scripts in a Go Lua interpreter, which under the race detector on a busy
// machine can take longer than the default 25 ms budget, and a claim that
// misses its budget is denied (a slow call never mints tokens), which would
// change an example's output. Against a real Redis the default is right.
var exampleBudget = hybrid.WithCallBudget(time.Second)

// exampleRedis returns a client of a Redis run in process, for the
// examples; use your own.
func exampleRedis() (*redis.Client, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return rdb, func() { rdb.Close(); m.Close() }
}

// Keys of tenants on the pro plan get 100 an hour, the others the
// default, 10.
func ExampleWithLimitFunc() {
	rdb, done := exampleRedis()
	defer done()
	plans := func(key string) tierlimit.Limit {
		if strings.HasPrefix(key, "pro:") {
			return tierlimit.PerHour(100)
		}
		return tierlimit.Limit{} // the default
	}
	lim, err := hybrid.New(rdb, tierlimit.PerHour(10), hybrid.WithLimitFunc(plans), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	for _, key := range []string{"free:1", "pro:2"} {
		admitted := 0
		for range 200 {
			if res, _ := lim.Allow(ctx, key); res.Allowed {
				admitted++
			}
		}
		res, _ := lim.Allow(ctx, key)
		fmt.Printf("%s: %d admitted at once, limit %v\n", key, admitted, res.Limit)
	}
	// Output:
	// free:1: 10 admitted at once, limit 10/1h0m0s
	// pro:2: 100 admitted at once, limit 100/1h0m0s
}

// Every key gets 100 an hour, and no more than 5 in any minute: both
// limits' buckets lease together, and each keeps its lease ledger.
func ExampleWithLimits() {
	rdb, done := exampleRedis()
	defer done()
	lim, err := hybrid.New(rdb, tierlimit.PerHour(100), hybrid.WithLimits(tierlimit.PerMinute(5)), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	admitted := 0
	for range 50 {
		if res, _ := lim.Allow(ctx, "user:1"); res.Allowed {
			admitted++
		}
	}
	res, _ := lim.Allow(ctx, "user:1")
	fmt.Printf("%d admitted at once; the next is denied: %v, retry within a minute: %v\n",
		admitted, !res.Allowed, res.RetryAfter > 0 && res.RetryAfter <= time.Minute)
	// Output:
	// 5 admitted at once; the next is denied: true, retry within a minute: true
}

// A request takes from its user's key and its org's, or from neither.
func ExampleLimiter_AllowAll() {
	rdb, done := exampleRedis()
	defer done()
	lim, err := hybrid.New(rdb, tierlimit.PerMinute(3), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	for _, user := range []string{"ann", "bob", "cid", "dan"} {
		res, _ := lim.AllowAll(ctx, tierlimit.Take{Key: "user:" + user, N: 1}, tierlimit.Take{Key: "org:acme", N: 1})
		fmt.Println(user, res.Allowed)
	}
	res, _ := lim.Allow(ctx, "user:dan") // dan's refused call took nothing from him
	fmt.Println("dan alone", res.Allowed, res.Remaining)
	// Output:
	// ann true
	// bob true
	// cid true
	// dan false
	// dan alone true 2
}

// Charge an estimate, then settle the real cost: here 300 of the 500
// tokens charged are given back.
func ExampleLimiter_Settle() {
	rdb, done := exampleRedis()
	defer done()
	lim, err := hybrid.New(rdb, tierlimit.PerHour(1000), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	res, _ := lim.AllowN(ctx, "org:acme", 500)
	fmt.Println("charged 500:", res.Allowed)
	res, _ = lim.Settle(ctx, "org:acme", 500, 200)
	fmt.Println("remaining after settling 200:", res.Remaining)
	// Output:
	// charged 500: true
	// remaining after settling 200: 800
}

// WaitN waits for the tokens, or fails at once when ctx's deadline comes
// first.
func ExampleLimiter_WaitN() {
	rdb, done := exampleRedis()
	defer done()
	lim, err := hybrid.New(rdb, tierlimit.PerSecond(20), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	lim.AllowN(ctx, "k", 20) // drained
	res, err := lim.WaitN(ctx, "k", 1)
	fmt.Println("admitted after a wait:", res.Allowed, err)
	// Output:
	// admitted after a wait: true <nil>
}

// A consumer takes up to 100 messages a call, as many as the queue's budget
// holds, until it holds none; an overrun settled after the fact puts the
// key in debt, and it takes nothing until the rate has repaid it.
func ExampleLimiter_AllowAtMost() {
	rdb, done := exampleRedis()
	defer done()
	lim, err := hybrid.New(rdb, tierlimit.PerHour(150), exampleBudget)
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	ctx := context.Background()
	var total int64
	for {
		n, _, _ := lim.AllowAtMost(ctx, "queue:7", 100)
		if n == 0 {
			break
		}
		total += n
	}
	fmt.Println("took", total)
	lim.Settle(ctx, "queue:7", 50, 60) // 10 more used than taken: 10 in debt
	n, res, _ := lim.AllowAtMost(ctx, "queue:7", 100)
	fmt.Println("took", n, "retry after", res.RetryAfter.Round(time.Minute))
	// Output:
	// took 150
	// took 0 retry after 4m0s
}
