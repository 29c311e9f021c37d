package remote

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
)

// tenant is what every limiter of the package offers for many tenants.
type tenant interface {
	decider
	AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error)
	WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
	AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error)
	LimitFor(key string) (tierlimit.Limit, error)
	engine() *store.Limiter
}

func (l *limiter) engine() *store.Limiter { return l.s }

// newTenant builds alg's limiter as a tenant.
func newTenant(t *testing.T, alg constructor, rdb redis.UniversalClient, l tierlimit.Limit, opts ...Option) tenant {
	t.Helper()
	d, err := alg(rdb, l, opts...)
	if err != nil {
		t.Fatalf("new(%v) = %v", l, err)
	}
	return d.(tenant)
}

// usedIn reads from Redis what key has used under its first limit, at
// the server time now (µs), from the state format of docs/operations.md:
// a token bucket's cap - k, GCRA's (TAT - now) / T, a window's count, a
// sliding log's sum.
func usedIn(t *testing.T, alg string, rdb redis.UniversalClient, keys []string, limit tierlimit.Limit, now int64) int64 {
	t.Helper()
	ctx := context.Background()
	state := keys[0]
	if alg == "SlidingLog" {
		state = keys[1]
	}
	v, err := rdb.Get(ctx, state).Result()
	if errors.Is(err, redis.Nil) {
		return 0 // an absent key is full, or an empty window
	}
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(v, ":")
	num := func(i int) int64 {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatalf("state %q of %s: field %d: %v", v, alg, i, err)
		}
		return x
	}
	switch alg {
	case "TokenBucket":
		return limit.Capacity() - num(0)
	case "GCRA":
		return (num(0) - now) * limit.Rate / limit.PeriodMicros()
	case "SlidingLog":
		return num(0)
	default: // fixed, anchored and sliding windows: the current count
		return num(1)
	}
}

// TestSettleRestoresDifference charges an estimate, settles it to the real
// cost, and reads the state in Redis: exactly the real cost is charged.
// Settling the other way takes the difference; settling never passes full
// and is never denied. Below empty, TokenBucket and GCRA go into debt (the
// steps' debt figures; the windows floor at empty, keeping no debt).
func TestSettleRestoresDifference(t *testing.T) {
	ctx := context.Background()
	limit := tierlimit.PerSecond(10)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0.Add(100 * time.Millisecond))
			now := t0.Add(100 * time.Millisecond).UnixMicro()
			l := newTenant(t, alg.new, rdb, limit)
			keys := l.engine().Keys("k")
			steps := []struct {
				name            string
				call            func() (tierlimit.Result, error)
				used, remaining int64
				debt            []int64 // used and remaining on a bucket, when they differ
			}{
				{"charge the estimate 8", func() (tierlimit.Result, error) { return l.AllowN(ctx, "k", 8) }, 8, 2, nil},
				{"settle 8 to 3", func() (tierlimit.Result, error) { return l.Settle(ctx, "k", 8, 3) }, 3, 7, nil},
				{"settle 2 to 5", func() (tierlimit.Result, error) { return l.Settle(ctx, "k", 2, 5) }, 6, 4, nil},
				// A bucket: 6 in debt (was: empty, 10 used).
				{"settle 0 to 10: below empty", func() (tierlimit.Result, error) { return l.Settle(ctx, "k", 0, 10) }, 10, 0, []int64{16, 0}},
				// A bucket: the debt repaid first (was: full).
				{"settle 10 to 0", func() (tierlimit.Result, error) { return l.Settle(ctx, "k", 10, 0) }, 0, 10, []int64{6, 4}},
				{"settle 10 to 0 again: full, not above", func() (tierlimit.Result, error) { return l.Settle(ctx, "k", 10, 0) }, 0, 10, nil},
			}
			for _, s := range steps {
				if s.debt != nil && !alg.windowed {
					s.used, s.remaining = s.debt[0], s.debt[1]
				}
				r, err := s.call()
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if !r.Allowed || r.Remaining != s.remaining {
					t.Errorf("%s: allowed %v, remaining %d; want true, %d", s.name, r.Allowed, r.Remaining, s.remaining)
				}
				if got := usedIn(t, alg.name, rdb, keys, limit, now); got != s.used {
					t.Errorf("%s: Redis holds %d used, want %d", s.name, got, s.used)
				}
			}
		})
	}
}

// TestSettleWithLimits settles every limit of a key at once.
func TestSettleWithLimits(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0)
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(10), WithLimits(tierlimit.PerMinute(20)))
			if r, _ := l.AllowN(ctx, "k", 10); !r.Allowed {
				t.Fatalf("AllowN(10) denied: %+v", r)
			}
			r, err := l.Settle(ctx, "k", 10, 4)
			if err != nil || r.Remaining != 6 {
				t.Fatalf("Settle(10, 4) = %+v, %v; want 6 remaining", r, err)
			}
			// The minute's limit holds 20 - 4 = 16: 6 more fit the second's,
			// and the minute's still has 10.
			if r, _ := l.AllowN(ctx, "k", 6); !r.Allowed || r.Remaining != 0 {
				t.Errorf("AllowN(6) after settling = %+v, want allowed, 0 left", r)
			}
		})
	}
}

// TestPlanChange drains a key at PerSecond(100) on a real Redis, then its
// LimitFunc answers PerSecond(1000): the key keeps its state (no fresh
// burst: right after the change only what the refill gave), then refills
// at the new rate. Windows keep their count (900 left of the new 1000,
// not a fresh window).
func TestPlanChange(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	checkOn(t, rdb, func(t *testing.T, b backend) {
		ctx := context.Background()
		for i, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				var pro atomic.Bool
				f := func(key string) tierlimit.Limit {
					if pro.Load() {
						return tierlimit.PerSecond(1000)
					}
					return tierlimit.Limit{} // the default, PerSecond(100)
				}
				opts := append([]Option{WithPrefix(fmt.Sprintf("plan%d:", i)), WithLimitFunc(f)}, b.opts...)
				l := newTenant(t, alg.new, b.rdb, tierlimit.PerSecond(100), opts...)
				at := t0.Add(100 * time.Millisecond)
				b.set(at)
				if r, err := l.AllowN(ctx, "tenant", 100); err != nil || !r.Allowed {
					t.Fatalf("AllowN(100) = %+v, %v; want allowed", r, err)
				}
				pro.Store(true)
				at = at.Add(5 * time.Millisecond) // half a token at the old rate
				b.set(at)
				r, err := l.AllowN(ctx, "tenant", 0)
				if err != nil {
					t.Fatal(err)
				}
				if r.Limit != tierlimit.PerSecond(1000) {
					t.Errorf("Result.Limit = %v after the change, want 1000/1s", r.Limit)
				}
				if !alg.windowed {
					if r.Remaining != 0 {
						t.Fatalf("right after the change: %d remaining, want 0 (no fresh burst)", r.Remaining)
					}
					at = at.Add(50 * time.Millisecond)
					b.set(at)
					if r, _ := l.AllowN(ctx, "tenant", 0); r.Remaining < 50 || r.Remaining > 51 {
						t.Errorf("50 ms after the change: %d remaining, want 50 or 51 (the new rate)", r.Remaining)
					}
					if r, _ := l.AllowN(ctx, "tenant", 50); !r.Allowed {
						t.Errorf("AllowN(50) 50 ms after the change = %+v, want allowed", r)
					}
					return
				}
				if r.Remaining != 900 {
					t.Errorf("right after the change: %d remaining, want 900 (the count carried over)", r.Remaining)
				}
				if r, _ := l.AllowN(ctx, "tenant", 901); r.Allowed {
					t.Errorf("AllowN(901) after the change = allowed, want denied")
				}
				if r, _ := l.AllowN(ctx, "tenant", 900); !r.Allowed {
					t.Errorf("AllowN(900) after the change = %+v, want allowed", r)
				}
			})
		}
	})
}

// TestPlanDowngrade: a key whose limit drops keeps its tokens up to the
// new capacity (a bucket with 5 of 100 left has 5 of 10); a window's count
// carries over, capped at the new rate (95 of 100 used: all 10 used).
func TestPlanDowngrade(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0)
			var free atomic.Bool
			f := func(string) tierlimit.Limit {
				if free.Load() {
					return tierlimit.PerSecond(10)
				}
				return tierlimit.Limit{}
			}
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(100), WithLimitFunc(f))
			if r, _ := l.AllowN(ctx, "k", 95); !r.Allowed {
				t.Fatal("AllowN(95) denied")
			}
			free.Store(true)
			r, err := l.AllowN(ctx, "k", 0)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(5)
			if alg.windowed {
				want = 0
			}
			if r.Remaining != want {
				t.Errorf("after the downgrade of a key with 95 of 100 used: %d remaining, want %d", r.Remaining, want)
			}
			if r, _ := l.AllowN(ctx, "fresh", 10); !r.Allowed || r.Remaining != 0 {
				t.Errorf("a fresh key at the new limit: %+v, want 10 allowed, 0 left", r)
			}
		})
	}
}

// TestLimitFuncPerKey: one limiter serves keys of different limits, each
// at its own, with the extras on every key.
func TestLimitFuncPerKey(t *testing.T) {
	ctx := context.Background()
	plans := map[string]tierlimit.Limit{"free": tierlimit.PerMinute(2), "pro": tierlimit.PerMinute(5)}
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0)
			l := newTenant(t, alg.new, rdb, tierlimit.PerMinute(3), WithLimitFunc(func(k string) tierlimit.Limit { return plans[k] }))
			for key, want := range map[string]int64{"free": 2, "pro": 5, "other": 3} {
				var got int64
				for range 10 {
					if r, err := l.Allow(ctx, key); err != nil {
						t.Fatal(err)
					} else if r.Allowed {
						got++
					}
				}
				if got != want {
					t.Errorf("%s: %d admitted of 10, want %d", key, got, want)
				}
			}
		})
	}
}
