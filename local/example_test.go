package local_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// Keys on the pro plan get 100 a second, the others the default 10.
func ExampleWithLimitFunc() {
	plan := func(key string) tierlimit.Limit {
		if strings.HasPrefix(key, "pro:") {
			return tierlimit.PerSecond(100)
		}
		return tierlimit.Limit{} // the default
	}
	l, _ := local.New(tierlimit.PerSecond(10), local.WithLimitFunc(plan))
	defer l.Close()
	ctx := context.Background()
	for _, key := range []string{"pro:acme", "free:bob"} {
		r, _ := l.AllowN(ctx, key, 1)
		fmt.Println(key, r.Limit, r.Remaining)
	}
	// Output:
	// pro:acme 100/1s 99
	// free:bob 10/1s 9
}

// A user's request counts against the user (1000 an hour) and their org
// (20 an hour) together: when the org is spent, the user is not charged.
func ExampleLimiter_AllowAll() {
	limits := func(key string) tierlimit.Limit {
		if strings.HasPrefix(key, "org:") {
			return tierlimit.PerHour(20)
		}
		return tierlimit.PerHour(1000)
	}
	l, _ := local.New(tierlimit.PerHour(1000), local.WithLimitFunc(limits))
	defer l.Close()
	ctx := context.Background()
	admitted := 0
	for range 100 {
		r, _ := l.AllowAll(ctx, tierlimit.Take{Key: "user:ann", N: 1}, tierlimit.Take{Key: "org:acme", N: 1})
		if r.Allowed {
			admitted++
		}
	}
	r, _ := l.AllowN(ctx, "user:ann", 0)
	fmt.Println(admitted, "admitted; ann has", r.Remaining, "left")
	// Output: 20 admitted; ann has 980 left
}

// WaitN blocks until the key admits, or says at once that the deadline
// cannot be met.
func ExampleLimiter_WaitN() {
	l, _ := local.New(tierlimit.PerSecond(10))
	defer l.Close()
	ctx := context.Background()
	l.AllowN(ctx, "k", 10) // drained: the next token is 100 ms away

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := l.WaitN(short, "k", 1)
	fmt.Println(errors.Is(err, tierlimit.ErrWaitDeadline))

	r, err := l.WaitN(ctx, "k", 1)
	fmt.Println(r.Allowed, err)
	// Output:
	// true
	// true <nil>
}

// An LLM call is charged its estimate of 4000 tokens up front, then
// settled with the 1234 it really used: the difference goes back.
func ExampleLimiter_Settle() {
	l, _ := local.New(tierlimit.PerHour(10_000))
	defer l.Close()
	ctx := context.Background()
	r, _ := l.AllowN(ctx, "team-7", 4000)
	fmt.Println("after the estimate:", r.Remaining)
	r, _ = l.Settle(ctx, "team-7", 4000, 1234)
	fmt.Println("after settling:", r.Remaining)
	// Output:
	// after the estimate: 6000
	// after settling: 8766
}

// A handler that charges an estimate and settles the real cost asks the
// key's limit first: a cost is at most its burst, and a suspended tenant
// (tierlimit.Blocked) is refused before any work.
func ExampleLimiter_LimitFor() {
	plans := func(key string) tierlimit.Limit {
		switch key {
		case "org:7":
			return tierlimit.PerDay(100_000).WithBurst(5000) // a token in 0.86 s: none comes back between the calls below
		case "org:9":
			return tierlimit.Blocked
		}
		return tierlimit.Limit{}
	}
	l, _ := local.New(tierlimit.PerSecond(10), local.WithLimitFunc(plans))
	defer l.Close()
	ctx := context.Background()
	for _, key := range []string{"org:7", "org:8", "org:9"} {
		limit, err := l.LimitFor(key)
		if err != nil || limit == tierlimit.Blocked {
			fmt.Println(key, "refused:", limit == tierlimit.Blocked, err)
			continue
		}
		burst := limit.Capacity()
		est := min(int64(8000), burst) // the estimate, at most the burst
		if r, _ := l.AllowN(ctx, key, est); !r.Allowed {
			fmt.Println(key, "retry after", r.RetryAfter)
			continue
		}
		used := int64(1234) // what the call really cost
		r, _ := l.Settle(ctx, key, est, min(used, burst))
		fmt.Println(key, limit, "remaining after settling:", r.Remaining)
	}
	// Output:
	// org:7 100000/24h0m0s burst 5000 remaining after settling: 3766
	// org:8 10/1s remaining after settling: 0
	// org:9 refused: true <nil>
}

// A batch consumer takes up to 100 messages, as many as the key holds; a
// request that used more than was left puts the key in debt.
func ExampleLimiter_AllowAtMost() {
	l, _ := local.New(tierlimit.PerHour(150))
	defer l.Close()
	ctx := context.Background()
	for range 2 {
		n, r, _ := l.AllowAtMost(ctx, "queue:7", 100)
		fmt.Println(n, r.Remaining)
	}
	r, _ := l.Settle(ctx, "queue:7", 50, 60) // 10 more used than taken: 10 in debt
	fmt.Println(r.Remaining, r.ResetAfter.Round(time.Minute))
	n, r, _ := l.AllowAtMost(ctx, "queue:7", 100)
	fmt.Println(n, r.RetryAfter.Round(time.Minute))
	// Output:
	// 100 50
	// 50 0
	// 0 1h4m0s
	// 0 4m0s
}
