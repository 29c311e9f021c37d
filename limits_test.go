package tierlimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// limitsUsersWrite are the limits of design.md §5 that earlier versions
// refused or rounded: bandwidth in bytes, prime daily quotas, long and short
// periods, a burst of 10^12. refusedBy names the tiers that refuse one in
// their constructor, and why.
var limitsUsersWrite = []struct {
	limit     tierlimit.Limit
	refusedBy map[string]string
}{
	{tierlimit.PerSecond(100_000_000), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.PerSecond(125_000_000), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.PerSecond(10_000_000_000), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.PerSecond(1_000_000_000_000), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.PerDay(1_000_003), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.PerDay(10_000_019), map[string]string{"remote sliding log": "memory"}},
	{tierlimit.Limit{Rate: 1_000_003, Period: 30 * 24 * time.Hour}, map[string]string{"remote sliding log": "memory"}},
	{tierlimit.Limit{Rate: 1, Period: 400 * 24 * time.Hour}, nil},
	{tierlimit.Limit{Rate: 7, Period: time.Millisecond}, nil},
	{tierlimit.PerSecond(1_000_000_000).WithBurst(1_000_000_000_000), map[string]string{
		"remote sliding log": "memory", "remote fixed window": "burst", "remote anchored window": "burst", "remote sliding window": "burst"}},
}

// refusal is what a constructor's error says for each reason of refusedBy.
var refusal = map[string]string{
	"memory": "sorted-set member per request",
	"burst":  "have no burst",
}

// TestEveryLimit runs limitsUsersWrite through every tier that runs on a
// clock of its client (all but hybrid), on a real Redis: those that refuse
// a limit do so in their constructor, with ErrInvalidLimit and the reason;
// those that accept it are exact. A bucket is drained of exactly
// its capacity, then told the exact wait for 1 token and for a larger cost
// (ceil(n·Period/Rate) µs), is denied 1 µs before that wait and admits the
// cost at it, and after a further step holds exactly what the refill gave,
// remainders carried across calls. A window admits exactly Rate, and the
// request is denied 1 µs before its RetryAfter and admitted at it.
func TestEveryLimit(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	for i, tt := range limitsUsersWrite {
		for _, tier := range tiers {
			if !tier.clocked {
				continue // hybrid: TestEveryLimitHybrid
			}
			t.Run(fmt.Sprintf("%v/%s", tt.limit, tier.name), func(t *testing.T) {
				t0 := time.Unix(1_700_000_000, 0)
				clock := clocktest.New(t0)
				d, err := tier.new(rdb, tt.limit, tierOptions{clock: clock, prefix: fmt.Sprintf("every%d:", i), maxKeys: 16})
				if why, refused := tt.refusedBy[tier.name]; refused {
					if !errors.Is(err, tierlimit.ErrInvalidLimit) || !contains(err, refusal[why]) {
						t.Fatalf("new(%v) = %v, want ErrInvalidLimit saying %q", tt.limit, err, refusal[why])
					}
					return
				}
				if err != nil {
					t.Fatalf("new(%v) = %v, want a limiter", tt.limit, err)
				}
				defer d.Close()
				if tier.window {
					checkWindow(t, d, tt.limit, clock, tier.name)
				} else {
					checkBucket(t, d, tt.limit, clock, tier.redis)
				}
			})
		}
	}
}

// TestEveryLimitHybrid runs limitsUsersWrite through hybrid, with default
// options, on real time (its bucket reads Redis's clock): every limit is
// accepted; a full bucket admits its capacity at once; a denial right after
// is for the caller's own cost, at most twice the exact wait plus the
// refill interval (G2), and ResetAfter at most the time to fill.
func TestEveryLimitHybrid(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	for i, tt := range limitsUsersWrite {
		t.Run(tt.limit.String(), func(t *testing.T) {
			l, err := hybrid.New(rdb, tt.limit, hybrid.WithPrefix(fmt.Sprintf("everyh%d:", i)))
			if err != nil {
				t.Fatalf("New(%v) = %v", tt.limit, err)
			}
			defer l.Close()
			c := tt.limit.Capacity()
			p := paceOf(tt.limit)
			if res := allowN(t, l, c); !res.Allowed {
				t.Fatalf("AllowN(%d) on a full bucket = %+v, want allowed", c, res)
			}
			for _, n := range []int64{1, c/3 + 1} {
				res := allowN(t, l, n)
				if hi := 2*p.wait(n) + hybrid.DefaultRefillInterval + 5*time.Millisecond; !res.Allowed && (res.RetryAfter <= 0 || res.RetryAfter > hi) {
					t.Errorf("AllowN(%d) drained: RetryAfter %v, want in (0, %v]", n, res.RetryAfter, hi)
				}
				if res.ResetAfter < 0 || res.ResetAfter > p.wait(c)+time.Microsecond {
					t.Errorf("AllowN(%d): ResetAfter %v, want within the time to fill, %v", n, res.ResetAfter, p.wait(c))
				}
			}
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if st := l.Stats(); st.Leased != st.Spent+st.Refunded+st.Lost+st.Held {
				t.Errorf("ledger %+v does not balance", st)
			}
		})
	}
}

func contains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

// pace is the time one token takes, num/den µs: Period/Rate.
type pace struct{ num, den *big.Int }

func paceOf(l tierlimit.Limit) pace {
	return pace{big.NewInt(l.PeriodMicros()), big.NewInt(l.Rate)}
}

// wait returns the µs n tokens take to refill: ceil(n·num/den).
func (p pace) wait(n int64) time.Duration {
	x := new(big.Int).Mul(big.NewInt(n), p.num)
	x.Add(x, new(big.Int).Sub(p.den, big.NewInt(1)))
	return time.Duration(x.Quo(x, p.den).Int64()) * time.Microsecond
}

// tokens returns the whole tokens d refills: floor(d·den/num).
func (p pace) tokens(d time.Duration) int64 {
	x := new(big.Int).Mul(big.NewInt(int64(d/time.Microsecond)), p.den)
	return x.Quo(x, p.num).Int64()
}

func allowN(t *testing.T, d tierlimit.Limiter, n int64) tierlimit.Result {
	t.Helper()
	res, err := d.AllowN(context.Background(), "k", n)
	if err != nil {
		t.Fatalf("AllowN(%d) = %v", n, err)
	}
	return res
}

// checkBucket drains a bucket and checks its waits against the exact
// answer, on a client clock that stands still. Redis (inRedis) expires the
// drained key in real time, when the bucket would be full on a real clock:
// a bucket that fills faster than the test's own pauses (-race, a loaded
// machine) may be gone before the checks that need it, which are then
// skipped.
func checkBucket(t *testing.T, d tierlimit.Limiter, l tierlimit.Limit, clock *clocktest.Clock, inRedis bool) {
	c := l.Capacity()
	p := paceOf(l)
	if res := allowN(t, d, c-1); !res.Allowed || res.Remaining != 1 {
		t.Fatalf("AllowN(%d) on a full bucket = %v, remaining %d; want true, 1", c-1, res.Allowed, res.Remaining)
	}
	drained := time.Now() // before the drain's write, whose TTL counts from its arrival
	res := allowN(t, d, 1)
	if inRedis && res.Remaining == c-1 && time.Since(drained) >= p.wait(1)+time.Millisecond {
		// The key of one token short lives p.wait(1) and a ms at least
		// (lib.lua's ttl_ms); CI at 4e0c2b9 saw it gone on 7/1ms.
		t.Logf("the bucket not checked further: %v of real time passed, and Redis expired its key, full after %v", time.Since(drained).Round(time.Microsecond), p.wait(1))
		return
	}
	if !res.Allowed || res.Remaining != 0 {
		t.Fatalf("AllowN(1) with 1 left = %v, remaining %d; want true, 0", res.Allowed, res.Remaining)
	}
	expired := func() bool {
		if !inRedis || time.Since(drained) < p.wait(c) {
			return false
		}
		t.Logf("the drained bucket not checked further: %v of real time passed, and Redis expired its key, full after %v", time.Since(drained).Round(time.Microsecond), p.wait(c))
		return true
	}
	m := c/3 + 1 // a larger cost
	for _, n := range []int64{1, m} {
		res := allowN(t, d, n)
		if expired() {
			return
		}
		if want := p.wait(n); res.Allowed || res.RetryAfter != want {
			t.Errorf("AllowN(%d) drained = %v, RetryAfter %v; want false, %v", n, res.Allowed, res.RetryAfter, want)
		}
		if want := p.wait(c); res.ResetAfter != want {
			t.Errorf("AllowN(%d) drained: ResetAfter %v, want %v", n, res.ResetAfter, want)
		}
	}
	w := p.wait(m)
	clock.Add(w - time.Microsecond)
	res = allowN(t, d, m)
	if expired() {
		return
	}
	if res.Allowed || res.RetryAfter != time.Microsecond {
		t.Errorf("AllowN(%d) 1µs before its wait = %v, RetryAfter %v; want false, 1µs", m, res.Allowed, res.RetryAfter)
	}
	clock.Add(time.Microsecond)
	if res := allowN(t, d, m); !expired() && (!res.Allowed || res.Remaining != p.tokens(w)-m) {
		t.Errorf("AllowN(%d) at its wait %v = %v, remaining %d; want true, %d", m, w, res.Allowed, res.Remaining, p.tokens(w)-m)
	}
	// An odd step: what the refill gave since the bucket was drained,
	// less what was taken, remainders included.
	clock.Add(7_777_777 * time.Microsecond)
	want := min(c, p.tokens(w+7_777_777*time.Microsecond)-m)
	if res := allowN(t, d, 0); res.Remaining != want {
		t.Errorf("AllowN(0) %v after draining = remaining %d, want %d", w+7_777_777*time.Microsecond, res.Remaining, want)
	}
}

func checkWindow(t *testing.T, d tierlimit.Limiter, l tierlimit.Limit, clock *clocktest.Clock, name string) {
	// The client clock stands still, but Redis expires a window's key in
	// real time, when the window would have ended on a real clock: a
	// window shorter than the test's own pauses (-race, a loaded machine)
	// may be gone before the checks that need it, which are then skipped.
	drained := time.Now()
	expired := func(what string) bool {
		if time.Since(drained) < l.Period {
			return false
		}
		t.Logf("%s not checked: %v of real time passed, and Redis expired the %v window", what, time.Since(drained).Round(time.Microsecond), l.Period)
		return true
	}
	if res := allowN(t, d, l.Rate); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("AllowN(%d) on a fresh window = %v, remaining %d; want true, 0", l.Rate, res.Allowed, res.Remaining)
	}
	res := allowN(t, d, 1)
	if res.Allowed {
		if expired("the denial after the drain") {
			return
		}
		t.Fatalf("AllowN(1) after %d = true, want false", l.Rate)
	}
	p := l.Period
	want := map[string]time.Duration{
		"remote fixed window":    p - time.Duration(clock.Now().UnixMicro()%l.PeriodMicros())*time.Microsecond,
		"remote anchored window": p,
		"remote sliding log":     p,
	}
	if w, ok := want[name]; ok && res.RetryAfter != w {
		t.Errorf("AllowN(1) drained: RetryAfter %v, want %v", res.RetryAfter, w)
	}
	retry := res.RetryAfter
	clock.Add(retry - time.Microsecond)
	if res := allowN(t, d, 1); res.Allowed && !expired("the denial 1µs before RetryAfter") {
		t.Errorf("AllowN(1) 1µs before RetryAfter %v = true, want false", retry)
	}
	clock.Add(time.Microsecond)
	if res := allowN(t, d, 1); !res.Allowed {
		t.Errorf("AllowN(1) at RetryAfter %v = false, want true", retry)
	}
}
