package remote

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/script"
)

// TestSlidingLogModel runs random calls (AllowAtMost's partial mode among
// them) and clock steps through slidinglog.lua, with one limit and with the same limit twice (on two pairs
// of keys), and checks every reply against logModel, and that the keys' TTLs
// keep the script's invariant: the sorted set lives at least until its
// newest entry leaves the window and at most two periods past it, and the
// state string outlives the set.
func TestSlidingLogModel(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	for li, lim := range [][2]int64{{1_000_000, 10}, {60_000_000, 3}, {7, 1}, {1_000, 50}} {
		period, rate := lim[0], lim[1]
		one := []string{fmt.Sprintf("a%d:z", li), fmt.Sprintf("a%d:h", li)}
		two := []string{fmt.Sprintf("b%d:z", li), fmt.Sprintf("b%d:h", li), fmt.Sprintf("b%d:z2", li), fmt.Sprintf("b%d:h2", li)}
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
			spec := fmt.Sprintf("%d:%d", period, rate)
			// Now and then AllowAtMost's partial mode, of up to twice the rate.
			mode := "0"
			if rng.IntN(8) == 0 {
				mode, cost = "2", 1+rng.Int64N(2*rate)
			}
			got1, err1 := script.SlidingLog.Run(ctx, rdb, one, 0, mode, cost, spec).Slice()
			got2, err2 := script.SlidingLog.Run(ctx, rdb, two, 0, mode, cost, spec, cost, spec).Slice()
			if err1 != nil || err2 != nil {
				t.Fatalf("limit %d step %d: %v, %v", li, step, err1, err2)
			}
			var want []any
			if mode == "2" {
				want = log.atMost(now, cost, period, rate)
			} else {
				want = log.call(now, cost, period, rate)
			}
			if !reflect.DeepEqual(got1, want) {
				t.Fatalf("limit %d step %d, mode %s cost %d at %d: one limit %v, model %v", li, step, mode, cost, now, got1, want)
			}
			if want2 := append(want, want[2:]...); !reflect.DeepEqual(got2, want2) {
				t.Fatalf("limit %d step %d, mode %s cost %d at %d: the limit twice %v, model %v", li, step, mode, cost, now, got2, want2)
			}
			z, _ := rdb.ZRangeWithScores(ctx, one[0], 0, -1).Result()
			if len(z) == 0 {
				continue
			}
			last := int64(z[len(z)-1].Score)
			zttl, _ := rdb.PTTL(ctx, one[0]).Result()
			httl, _ := rdb.PTTL(ctx, one[1]).Result()
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
	return []any{allowed, int64(0), rate - sum, retry, reset}
}

// atMost grants min(n, what the window still admits) at now as
// slidinglog.lua's partial mode must, and returns its reply: a grant is an
// admitted call of that cost; none is a denied call of cost 1, which
// charges nothing.
func (m *logModel) atMost(now, n, period, rate int64) []any {
	for len(*m) > 0 && (*m)[0].t <= now-period {
		*m = (*m)[1:]
	}
	sum := int64(0)
	for _, e := range *m {
		sum += e.c
	}
	if g := min(n, rate-sum); g >= 1 {
		reply := m.call(now, g, period, rate)
		reply[1] = g
		return reply
	}
	return m.call(now, 1, period, rate)
}

// TestTokenBucketClockStepsBack steps the server's clock back below a
// bucket's last write: the bucket is decided at that write's time (nothing
// refills until the clock passes it, and then only from it), and its waits
// and TTL count from the server's clock.
func TestTokenBucketClockStepsBack(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	tb, err := NewTokenBucket(b.rdb, tierlimit.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	allow := func(n int64) func() (tierlimit.Result, error) {
		return func() (tierlimit.Result, error) { return tb.AllowN(ctx, "k", n) }
	}
	steps := []struct {
		at         time.Time
		call       func() (tierlimit.Result, error)
		allowed    bool
		remaining  int64
		retry, ttl time.Duration // ttl: at least, of the bucket's key; 0: none checked
	}{
		{ms(0), allow(10), true, 0, 0, time.Second},
		// 500 ms back: empty, as at 0 ms; one token 100 ms after 0 ms.
		{ms(-500), allow(1), false, 0, 600 * time.Millisecond, 0},
		{ms(-500), func() (tierlimit.Result, error) {
			_, err := tb.Settle(ctx, "k", 5, 0) // 5 given back
			return tierlimit.Result{Allowed: true, Remaining: 5}, err
		}, true, 5, 0, time.Second}, // full 500 ms after 0 ms
		// Refilled from 0 ms only, not from -500 ms.
		{ms(200), allow(0), true, 7, 0, 0},
	}
	for i, s := range steps {
		b.set(s.at)
		r, err := s.call()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry {
			t.Errorf("step %d at %v: %+v, want allowed %v, %d remaining, RetryAfter %v",
				i, s.at.Sub(t0), r, s.allowed, s.remaining, s.retry)
		}
		if s.ttl > 0 {
			if ttl, _ := b.rdb.PTTL(ctx, tb.s.Keys("k")[0]).Result(); ttl < s.ttl {
				t.Errorf("step %d at %v: TTL %v, want at least %v", i, s.at.Sub(t0), ttl, s.ttl)
			}
		}
	}
}
