package tierlimit_test

// The input rules, the same on every tier: each bad input is an error
// that errors.Is tells apart, decided before any call to Redis, charging
// nothing.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// badCall is a call with bad input and the error it must wrap.
type badCall struct {
	name string
	call func(ctx context.Context, l limiter) error
	want error
	// perKey: the call needs the LimitFunc's answers (an "org:" or
	// "bad:" key).
	perKey bool
}

// Keys of the input rules' limiters: the default limit is 10/s, "org:"
// keys are 20/s, and "bad:" keys get an invalid limit from the LimitFunc
// ("bad:burst" only on a window, which takes no burst).
var inputAnswers = map[string]tierlimit.Limit{
	"org:a":        tierlimit.PerSecond(20),
	"bad:neg":      {Rate: -1, Period: time.Second},
	"bad:noperiod": {Rate: 5},
	"bad:nanos":    {Rate: 1, Period: time.Nanosecond},
	"bad:huge":     tierlimit.PerSecond(math.MaxInt64),
	"bad:burst":    tierlimit.PerSecond(10).WithBurst(20),
}

func callAllowN(key string, n int64) func(context.Context, limiter) error {
	return func(ctx context.Context, l limiter) error { _, err := l.AllowN(ctx, key, n); return err }
}

func callAllowAll(takes ...tierlimit.Take) func(context.Context, limiter) error {
	return func(ctx context.Context, l limiter) error { _, err := l.AllowAll(ctx, takes...); return err }
}

func callWaitN(key string, n int64) func(context.Context, limiter) error {
	return func(ctx context.Context, l limiter) error { _, err := l.WaitN(ctx, key, n); return err }
}

func callSettle(key string, charged, used int64) func(context.Context, limiter) error {
	return func(ctx context.Context, l limiter) error { _, err := l.Settle(ctx, key, charged, used); return err }
}

func callAllowAtMost(key string, n int64) func(context.Context, limiter) error {
	return func(ctx context.Context, l limiter) error { _, _, err := l.AllowAtMost(ctx, key, n); return err }
}

// badCalls are the bad inputs of every tier's calls; window: the tier
// counts windows, which take no burst.
func badCalls(window bool) []badCall {
	long := strings.Repeat("k", tierlimit.MaxKeyLen+1)
	many := make([]tierlimit.Take, tierlimit.MaxTakes+1)
	for i := range many {
		many[i] = tierlimit.Take{Key: fmt.Sprint("k", i), N: 1}
	}
	calls := []badCall{
		{"AllowN empty key", callAllowN("", 1), tierlimit.ErrInvalidKey, false},
		{"AllowN long key", callAllowN(long, 1), tierlimit.ErrInvalidKey, false},
		{"AllowN negative cost", callAllowN("a", -1), tierlimit.ErrInvalidCost, false},
		{"AllowN cost over the burst", callAllowN("a", 11), tierlimit.ErrInvalidCost, false},
		{"AllowN cost over the key's burst", callAllowN("org:a", 21), tierlimit.ErrInvalidCost, true},
		{"AllowN max cost", callAllowN("a", math.MaxInt64), tierlimit.ErrInvalidCost, false},
		{"AllowN min cost", callAllowN("a", math.MinInt64), tierlimit.ErrInvalidCost, false},
		{"Reset empty key", func(ctx context.Context, l limiter) error { return l.Reset(ctx, "") }, tierlimit.ErrInvalidKey, false},

		{"AllowAll no takes", callAllowAll(), tierlimit.ErrInvalidCost, false},
		{"AllowAll empty key", callAllowAll(tierlimit.Take{Key: "", N: 1}), tierlimit.ErrInvalidKey, false},
		{"AllowAll empty key after a good take", callAllowAll(tierlimit.Take{Key: "x", N: 1}, tierlimit.Take{Key: "", N: 1}), tierlimit.ErrInvalidKey, false},
		{"AllowAll long key", callAllowAll(tierlimit.Take{Key: "x", N: 1}, tierlimit.Take{Key: long, N: 1}), tierlimit.ErrInvalidKey, false},
		{"AllowAll negative cost", callAllowAll(tierlimit.Take{Key: "x", N: 1}, tierlimit.Take{Key: "a", N: -1}), tierlimit.ErrInvalidCost, false},
		{"AllowAll cost over the burst", callAllowAll(tierlimit.Take{Key: "a", N: 11}), tierlimit.ErrInvalidCost, false},
		{"AllowAll cost over the key's burst", callAllowAll(tierlimit.Take{Key: "x", N: 1}, tierlimit.Take{Key: "org:a", N: 21}), tierlimit.ErrInvalidCost, true},
		{"AllowAll over the burst once added up", callAllowAll(tierlimit.Take{Key: "a", N: 6}, tierlimit.Take{Key: "a", N: 5}), tierlimit.ErrInvalidCost, false},
		{"AllowAll overflow once added up", callAllowAll(tierlimit.Take{Key: "a", N: math.MaxInt64}, tierlimit.Take{Key: "a", N: 1}), tierlimit.ErrInvalidCost, false},
		{"AllowAll too many keys", callAllowAll(many...), tierlimit.ErrInvalidCost, false},

		{"WaitN empty key", callWaitN("", 1), tierlimit.ErrInvalidKey, false},
		{"WaitN long key", callWaitN(long, 1), tierlimit.ErrInvalidKey, false},
		{"WaitN negative cost", callWaitN("a", -1), tierlimit.ErrInvalidCost, false},
		{"WaitN cost over the burst", callWaitN("a", 11), tierlimit.ErrInvalidCost, false},
		{"WaitN cost over the key's burst", callWaitN("org:a", 21), tierlimit.ErrInvalidCost, true},

		{"Settle empty key", callSettle("", 1, 0), tierlimit.ErrInvalidKey, false},
		{"Settle long key", callSettle(long, 1, 0), tierlimit.ErrInvalidKey, false},
		{"Settle negative charge", callSettle("a", -1, 0), tierlimit.ErrInvalidCost, false},
		{"Settle negative use", callSettle("a", 0, -1), tierlimit.ErrInvalidCost, false},
		{"Settle charge over the burst", callSettle("a", 11, 0), tierlimit.ErrInvalidCost, false},
		{"Settle charge over the key's burst", callSettle("org:a", 21, 0), tierlimit.ErrInvalidCost, true},

		{"AllowAtMost empty key", callAllowAtMost("", 1), tierlimit.ErrInvalidKey, false},
		{"AllowAtMost long key", callAllowAtMost(long, 1), tierlimit.ErrInvalidKey, false},
		{"AllowAtMost zero", callAllowAtMost("a", 0), tierlimit.ErrInvalidCost, false},
		{"AllowAtMost negative", callAllowAtMost("a", -1), tierlimit.ErrInvalidCost, false},
		{"AllowAtMost min", callAllowAtMost("a", math.MinInt64), tierlimit.ErrInvalidCost, false},
		{"AllowAtMost over MaxRate", callAllowAtMost("a", tierlimit.MaxRate+1), tierlimit.ErrInvalidCost, false},
		{"AllowAtMost max", callAllowAtMost("a", math.MaxInt64), tierlimit.ErrInvalidCost, false},
	}
	for key := range inputAnswers {
		if !strings.HasPrefix(key, "bad:") || key == "bad:burst" && !window {
			continue
		}
		calls = append(calls,
			badCall{"AllowN " + key, callAllowN(key, 1), tierlimit.ErrInvalidLimit, true},
			badCall{"AllowAll of a good key and " + key, callAllowAll(tierlimit.Take{Key: "x", N: 1}, tierlimit.Take{Key: key, N: 1}), tierlimit.ErrInvalidLimit, true},
			badCall{"WaitN " + key, callWaitN(key, 1), tierlimit.ErrInvalidLimit, true},
			badCall{"Settle " + key, callSettle(key, 1, 0), tierlimit.ErrInvalidLimit, true},
			badCall{"AllowAtMost " + key, callAllowAtMost(key, 1), tierlimit.ErrInvalidLimit, true},
		)
	}
	return calls
}

// TestInputRules makes every bad call of badCalls on every tier, on a
// limiter of 10/s and on one whose LimitFunc answers inputAnswers: first
// on a client of no Redis (the input is judged before any call), then on a
// real Redis, where the keys of the refused calls are then found full
// (charged nothing). After Close, a closable tier's calls are
// tierlimit.ErrClosed, whatever their input.
//
// Hybrid with a LimitFunc once skipped the cost of a key of the default
// limit: AllowN of 11 and of math.MaxInt64 and AllowAll of 11 drained the
// key's lease with no error, and WaitN of 11 never returned (found by this
// test at 4d7b32a's successor, fixed in the commit after it).
func TestInputRules(t *testing.T) {
	s := redistest.Start(t)
	limits := func(key string) tierlimit.Limit { return inputAnswers[key] }
	for _, tier := range tiers {
		t.Run(tier.name, func(t *testing.T) {
			for _, where := range []struct{ name, addr string }{{"no redis", "127.0.0.1:1"}, {"redis", s.Addr}} {
				for _, f := range []tierlimit.LimitFunc{nil, limits} {
					rdb := redis.NewClient(&redis.Options{Addr: where.addr})
					defer rdb.Close()
					l, err := tier.new(rdb, tierlimit.PerSecond(10), tierOptions{limitFunc: f, prefix: "inputs:"})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					name := where.name
					if f != nil {
						name += ", LimitFunc"
					}
					checkInputRules(t, name, tier, l, f != nil, where.addr == s.Addr)
				}
			}
		})
	}
}

// checkInputRules makes the bad calls on l (perKey: l has the LimitFunc;
// inRedis: on a real Redis, where it then peeks), then closes l.
func checkInputRules(t *testing.T, name string, tier tier, l limiter, perKey, inRedis bool) {
	t.Helper()
	ctx := context.Background()
	for _, c := range badCalls(tier.window) {
		if c.perKey && !perKey {
			continue
		}
		err := c.call(ctx, l)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %s = %v, want %v", name, c.name, err, c.want)
			continue
		}
		// One error form: the package the caller called, then the
		// sentinel, then the detail, no other package's prefix.
		pkg := strings.Fields(tier.name)[0]
		if msg := err.Error(); !strings.HasPrefix(msg, pkg+": "+c.want.Error()) || strings.Count(msg, ": tierlimit: ") != 1 ||
			strings.Contains(msg[len(pkg)+2:], "hybrid: ") || strings.Contains(msg[len(pkg)+2:], "remote: ") || strings.Contains(msg[len(pkg)+2:], "local: ") {
			t.Errorf("%s: %s = %q, want %q then the detail", name, c.name, msg, pkg+": "+c.want.Error())
		}
	}
	if inRedis {
		full := map[string]int64{"a": 10, "x": 10}
		if perKey {
			full["org:a"] = 20
		}
		for key, want := range full {
			if r, err := l.AllowN(ctx, key, 0); err != nil || r.Remaining != want {
				t.Errorf("%s: AllowN(%q, 0) after the refused calls = %+v, %v; want %d remaining", name, key, r, err, want)
			}
		}
	}
	if !tier.closable {
		return
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []badCall{
		{name: "AllowN", call: callAllowN("a", 1)},
		{name: "AllowAll", call: callAllowAll(tierlimit.Take{Key: "a", N: 1})},
		{name: "WaitN", call: callWaitN("a", 1)},
		{name: "Settle", call: callSettle("a", 1, 0)},
		{name: "AllowAtMost", call: callAllowAtMost("a", 1)},
		{name: "Reset", call: func(ctx context.Context, l limiter) error { return l.Reset(ctx, "a") }},
	} {
		if err := c.call(ctx, l); !errors.Is(err, tierlimit.ErrClosed) {
			t.Errorf("%s: %s after Close = %v, want ErrClosed", name, c.name, err)
		}
	}
}
