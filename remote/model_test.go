package remote

import (
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

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

// TestSlidingLogPathsAgree runs random calls and clock steps through
// slidinglog.lua's single-limit path and its general path (the same limit
// given twice, on two pairs of keys), and checks that the replies (for the
// first limit), the stored states and the sorted sets agree, and that the
// keys' TTLs keep the script's invariant: the sorted set lives at least
// until its newest entry leaves the window and at most two periods past
// it, and the state string outlives the set.
func TestSlidingLogPathsAgree(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	b := backend{rdb: rdb}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	for li, lim := range [][2]int64{{1_000_000, 10}, {60_000_000, 3}, {7, 1}, {1_000, 50}} {
		period, rate := lim[0], lim[1]
		fast := []string{fmt.Sprintf("f%d:z", li), fmt.Sprintf("f%d:h", li)}
		gen := []string{fmt.Sprintf("g%d:z", li), fmt.Sprintf("g%d:h", li), fmt.Sprintf("g%d:z2", li), fmt.Sprintf("g%d:h2", li)}
		now := int64(1_700_000_000_000_000)
		m.SetTime(time.UnixMicro(now))
		var log logModel
		for step := 0; step < 1000; step++ {
			dt := rng.Int64N(period/4 + 1)
			if rng.IntN(20) == 0 {
				dt = rng.Int64N(3 * period) // sometimes past the window
			}
			now += dt
			// TIME reads the clock set; TTLs run down, and keys expire,
			// as far as it is fast-forwarded.
			m.SetTime(time.UnixMicro(now))
			m.FastForward(time.Duration(dt) * time.Microsecond)
			// Mostly cost 1, as most callers charge: the log then trims by
			// score; now and then another cost, which stops that until
			// the log empties.
			cost := int64(1)
			if rng.IntN(10) == 0 {
				cost = rng.Int64N(rate + 1)
			}
			got, err1 := lua.SlidingLog.Run(ctx, b.rdb, fast, 0, cost, period, rate).Slice()
			want, err2 := lua.SlidingLog.Run(ctx, b.rdb, gen, 0, cost, period, rate, period, rate).Slice()
			if err1 != nil || err2 != nil {
				t.Fatalf("limit %d step %d: %v, %v", li, step, err1, err2)
			}
			if !reflect.DeepEqual(got, want[:5]) {
				t.Fatalf("limit %d step %d, cost %d at %d: single path %v, general path %v", li, step, cost, now, got, want)
			}
			if model := log.call(now, cost, period, rate); !reflect.DeepEqual(got, model) {
				t.Fatalf("limit %d step %d, cost %d at %d: script %v, model %v", li, step, cost, now, got, model)
			}
			sf, _ := b.rdb.Get(ctx, fast[1]).Result()
			sg, _ := b.rdb.Get(ctx, gen[1]).Result()
			if sf != sg {
				t.Fatalf("limit %d step %d: single path stored %q, general path %q", li, step, sf, sg)
			}
			zf, _ := b.rdb.ZRangeWithScores(ctx, fast[0], 0, -1).Result()
			zg, _ := b.rdb.ZRangeWithScores(ctx, gen[0], 0, -1).Result()
			if !reflect.DeepEqual(zf, zg) {
				t.Fatalf("limit %d step %d: single path's set %v, general path's %v", li, step, zf, zg)
			}
			if len(zf) == 0 {
				continue
			}
			last := int64(zf[len(zf)-1].Score)
			zttl, _ := b.rdb.PTTL(ctx, fast[0]).Result()
			httl, _ := b.rdb.PTTL(ctx, fast[1]).Result()
			lo := time.Duration(last+period-now) * time.Microsecond
			hi := time.Duration(last+2*period-now)*time.Microsecond + 2*time.Millisecond
			if zttl < lo || zttl > hi || httl < zttl {
				t.Fatalf("limit %d step %d: set TTL %v, state TTL %v; want the set's in [%v, %v] and the state's at least as long",
					li, step, zttl, httl, lo, hi)
			}
		}
	}
}

// logModel is a sliding log in plain Go: the admitted entries, oldest
// first.
type logModel []struct{ t, c int64 }

// call decides a call of cost at now as slidinglog.lua must, and returns
// its reply.
func (m *logModel) call(now, cost, period, rate int64) []any {
	for len(*m) > 0 && (*m)[0].t <= now-period {
		*m = (*m)[1:]
	}
	sum := int64(0)
	for _, e := range *m {
		sum += e.c
	}
	allowed, retry := int64(0), int64(0)
	if sum+cost <= rate {
		allowed = 1
		if cost > 0 {
			*m = append(*m, struct{ t, c int64 }{now, cost})
			sum += cost
		}
	} else {
		need := sum + cost - rate
		for _, e := range *m {
			if need -= e.c; need <= 0 {
				retry = e.t + period - now
				break
			}
		}
	}
	reset := int64(0)
	if len(*m) > 0 {
		reset = (*m)[len(*m)-1].t + period - now
	}
	return []any{allowed, allowed * cost, rate - sum, retry, reset}
}

// TestSlidingLogReadsOldState: a log whose state string predates the
// cached oldest entry ("sum:seq:last"), the sorted set's expiry
// ("sum:seq:last:first:fcost") or the unit flag (six fields) decides
// exactly as one written now.
func TestSlidingLogReadsOldState(t *testing.T) {
	for _, fields := range []int{3, 5, 6} {
		t.Run(fmt.Sprint(fields, " fields"), func(t *testing.T) { testSlidingLogReadsOldState(t, fields) })
	}
}

func testSlidingLogReadsOldState(t *testing.T, fields int) {
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
	if len(f) != 7 {
		t.Fatalf("state %q: want 7 fields", v)
	}
	if err := b.rdb.Set(ctx, hs, strings.Join(f[:fields], ":"), time.Minute).Err(); err != nil {
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
