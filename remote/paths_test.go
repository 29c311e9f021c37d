package remote

import (
	"strings"
	"time"

	"context"
	"fmt"
	"github.com/tierlimit/tierlimit"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tierlimit/tierlimit/lua"
)

// TestTokenBucketPathsAgree runs random claims, refunds and clock steps
// through tokenbucket.lua's single-limit fast path and its general path
// (forced by a refund marker key) on two keys, and checks that every reply
// and every stored state agree.
func TestTokenBucketPathsAgree(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	// unit, per (units per µs), cap (capacity × unit), as the Go side
	// computes them for: 10/s burst 10; 7 per 3 µs-units with burst 13;
	// 1/h burst 1.
	limits := [][3]int64{{100_000, 1, 1_000_000}, {7, 3, 91}, {3_600_000_000, 1, 3_600_000_000}}
	rng := rand.New(rand.NewPCG(1, 2))
	for li, lim := range limits {
		unit, per, capacity := lim[0], lim[1], lim[2]
		tokens := capacity / unit
		fast, general := fmt.Sprintf("fast%d", li), fmt.Sprintf("general%d", li)
		now := int64(1_700_000_000_000_000)
		for step := 0; step < 3000; step++ {
			now += rng.Int64N(3 * unit / per)
			if rng.IntN(50) == 0 {
				now -= rng.Int64N(unit / per) // a clock that steps back
			}
			var min, want, refund int64
			switch rng.IntN(4) {
			case 0:
				refund = 1 + rng.Int64N(tokens)
			case 1:
				want = rng.Int64N(tokens + 1)
				min = rng.Int64N(want + 1)
			default:
				want = 1 + rng.Int64N(tokens)
				min = want
			}
			args := []any{now, min, want, refund, unit, per, capacity}
			got, err1 := lua.TokenBucket.Run(ctx, b.rdb, []string{fast}, args...).Slice()
			want2, err2 := lua.TokenBucket.Run(ctx, b.rdb, []string{general, fmt.Sprintf("m%d:%d", li, step)}, args...).Slice()
			if err1 != nil || err2 != nil {
				t.Fatalf("limit %d step %d: %v, %v", li, step, err1, err2)
			}
			if !reflect.DeepEqual(got, want2) {
				t.Fatalf("limit %d step %d, args %v: fast path %v, general path %v", li, step, args, got, want2)
			}
			sf, _ := b.rdb.Get(ctx, fast).Result()
			sg, _ := b.rdb.Get(ctx, general).Result()
			if sf != sg {
				t.Fatalf("limit %d step %d, args %v: fast path stored %q, general path %q", li, step, args, sf, sg)
			}
		}
	}
}

// TestWindowPathsAgree runs random calls and clock steps through the
// single-limit fast paths of anchoredwindow.lua, slidingwindow.lua,
// fixedwindow.lua and gcra.lua, and
// through their general paths (the same limit given twice, on two keys),
// and checks that the replies (for the first limit) and stored states agree.
func TestWindowPathsAgree(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	scripts := []struct {
		name   string
		run    func(keys []string, args ...any) ([]any, error)
		limits [][]int64 // per limit: period µs, rate[, grain µs]
	}{
		{"anchored", func(keys []string, args ...any) ([]any, error) {
			return lua.AnchoredWindow.Run(ctx, b.rdb, keys, args...).Slice()
		}, [][]int64{{1_000_000, 10}, {60_000_000, 3}, {7, 1}}},
		{"sliding", func(keys []string, args ...any) ([]any, error) {
			return lua.SlidingWindow.Run(ctx, b.rdb, keys, args...).Slice()
		}, [][]int64{{1_000_000, 10, 1}, {60_000_000, 100, 1_000_000}, {12, 5, 3}}},
		{"fixed", func(keys []string, args ...any) ([]any, error) {
			return lua.FixedWindow.Run(ctx, b.rdb, keys, args...).Slice()
		}, [][]int64{{1_000_000, 10}, {60_000_000, 3}, {7, 1}}},
		// GCRA's ARGV per limit: emission interval T, tolerance tau, both
		// in µs; the rate is only for the random costs below.
		{"gcra", func(keys []string, args ...any) ([]any, error) {
			return lua.GCRA.Run(ctx, b.rdb, keys, args...).Slice()
		}, [][]int64{{100_000, 900_000}, {7, 70}, {3_600_000_000, 0}}},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sc := range scripts {
		for li, lim := range sc.limits {
			fast := fmt.Sprintf("%s:fast%d", sc.name, li)
			g1, g2 := fmt.Sprintf("%s:g1:%d", sc.name, li), fmt.Sprintf("%s:g2:%d", sc.name, li)
			period, rate := lim[0], lim[1]
			if sc.name == "gcra" { // T and tau: ten emissions a step, costs up to the burst
				period, rate = 10*lim[0], lim[1]/lim[0]+1
			}
			now := int64(1_700_000_000_000_000)
			for step := 0; step < 2000; step++ {
				now += rng.Int64N(period/4 + 1)
				cost := rng.Int64N(rate + 1)
				one := []any{now, cost}
				two := []any{now, cost}
				for _, v := range lim {
					one = append(one, v)
				}
				for range 2 {
					for _, v := range lim {
						two = append(two, v)
					}
				}
				got, err1 := sc.run([]string{fast}, one...)
				gen, err2 := sc.run([]string{g1, g2}, two...)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s limit %d step %d: %v, %v", sc.name, li, step, err1, err2)
				}
				if !reflect.DeepEqual(got, gen[:5]) {
					t.Fatalf("%s limit %d step %d, args %v: fast path %v, general path %v", sc.name, li, step, one, got, gen)
				}
				sf, _ := b.rdb.Get(ctx, fast).Result()
				sg, _ := b.rdb.Get(ctx, g1).Result()
				if sf != sg {
					t.Fatalf("%s limit %d step %d, args %v: fast path stored %q, general path %q", sc.name, li, step, one, sf, sg)
				}
			}
		}
	}
}

// TestSlidingLogReadsOldState: a log whose state string predates the
// cached oldest entry ("sum:seq:last") decides exactly as one written now.
func TestSlidingLogReadsOldState(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	clock := time.Unix(1_700_000_000, 0)
	b.set(clock)
	sl, err := NewSlidingLog(b.rdb, tierlimit.Limit{Rate: 5, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		for _, k := range []string{"old", "new"} {
			if _, err := sl.AllowN(ctx, k, 1); err != nil {
				t.Fatal(err)
			}
		}
		clock = clock.Add(100 * time.Millisecond)
		b.set(clock)
	}
	// Rewrite "old"'s state the way the previous script stored it.
	hs := sl.redisKeys("old")[1]
	v, err := b.rdb.Get(ctx, hs).Result()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(v, ":")
	if len(f) != 5 {
		t.Fatalf("state %q: want 5 fields", v)
	}
	if err := b.rdb.Set(ctx, hs, strings.Join(f[:3], ":"), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for step := 0; step < 12; step++ {
		got, err1 := sl.AllowN(ctx, "old", 2)
		want, err2 := sl.AllowN(ctx, "new", 2)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if got != want {
			t.Fatalf("step %d: old state %+v, new state %+v", step, got, want)
		}
		clock = clock.Add(150 * time.Millisecond)
		b.set(clock)
	}
}
