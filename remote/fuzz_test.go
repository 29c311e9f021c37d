package remote

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// FuzzAllowN drives every algorithm with arbitrary limits, costs, keys and
// time steps on miniredis: no panic, bad input gives a typed error, and a
// decision's Remaining stays within [0, capacity]; so does a Settle of the
// cost to half of it, one of nothing to the cost (into debt, on a bucket),
// and an AllowAll of the key with another; AllowAtMost of the cost grants
// between 0 and min(cost, capacity), Allowed exactly when it grants.
func FuzzAllowN(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(1_000_000), int64(0), "k", int64(1), int64(0), int64(3))
	f.Add(uint8(1), int64(3), int64(1_000_000), int64(5), "a{b}", int64(5), int64(333_333), int64(2))
	f.Add(uint8(2), int64(1), int64(1), int64(0), "\xff", int64(1), int64(1), int64(0))
	f.Add(uint8(5), int64(999_983), int64(86_400_000_000), int64(0), "}{", int64(999_983), int64(1), int64(7))
	f.Add(uint8(4), int64(-1), int64(-1), int64(-1), "", int64(-1), int64(-1), int64(-1))
	f.Add(uint8(3), int64(7), int64(1<<50), int64(0), "x", int64(8), int64(1<<40), int64(1))
	f.Add(uint8(0), int64(1_000_000_000_000), int64(1_000_000), int64(0), "bw", int64(333_333_333_334), int64(777_777), int64(4))
	f.Add(uint8(0), int64(10_000_019), int64(86_400_000_000), int64(0), "day", int64(3_333_340), int64(7_777_777), int64(4))
	f.Add(uint8(1), int64(1_000_003), int64(86_400_000_000), int64(0), "day", int64(2), int64(86_399), int64(3))
	f.Add(uint8(5), int64(125_000_000), int64(1_000_000), int64(0), "sw", int64(125_000_000), int64(1), int64(3))
	m, rdb := redistest.Mini(f)
	f.Fuzz(func(t *testing.T, alg uint8, rate, periodMicros, burst int64, key string, n, stepMicros, repeat int64) {
		a := algorithms[int(alg)%len(algorithms)]
		limit := tierlimit.Limit{Rate: rate, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
		if periodMicros > 1<<53 || periodMicros < -(1<<53) {
			limit.Period = time.Duration(periodMicros) // keep overflowing inputs overflowing
		}
		d, err := a.new(rdb, limit)
		if err != nil {
			if !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Fatalf("%s: New(%+v) = %v, want ErrInvalidLimit", a.name, limit, err)
			}
			return
		}
		capacity := limit.Capacity()
		if a.windowed {
			capacity = limit.Rate
		}
		now := time.Unix(1_700_000_000, 0)
		m.SetTime(now)
		for i := int64(0); i <= repeat%8; i++ {
			r, err := d.AllowN(context.Background(), key, n)
			switch {
			case err != nil:
				if !errors.Is(err, tierlimit.ErrInvalidKey) && !errors.Is(err, tierlimit.ErrInvalidCost) {
					t.Fatalf("%s %v: AllowN(%q, %d) = %v, want a typed error", a.name, limit, key, n, err)
				}
				return
			case r.Remaining < 0 || r.Remaining > capacity:
				t.Fatalf("%s %v: AllowN(%q, %d) Remaining = %d, want within [0, %d]", a.name, limit, key, n, r.Remaining, capacity)
			case r.RetryAfter < 0 || r.ResetAfter < 0:
				t.Fatalf("%s %v: negative durations %+v", a.name, limit, r)
			case r.Allowed != (r.RetryAfter == 0):
				t.Fatalf("%s %v: Allowed %v with RetryAfter %v", a.name, limit, r.Allowed, r.RetryAfter)
			}
			if r.Allowed && i%2 == 1 {
				s, err := d.(tenant).Settle(context.Background(), key, n, n/2)
				if err != nil || !s.Allowed || s.Remaining < r.Remaining || s.Remaining > capacity {
					t.Fatalf("%s %v: Settle(%q, %d, %d) after %+v = %+v, %v; want allowed, Remaining in [%d, %d]",
						a.name, limit, key, n, n/2, r, s, err, r.Remaining, capacity)
				}
			}
			if i%4 == 3 {
				s, err := d.(tenant).Settle(context.Background(), key, 0, n)
				if err != nil || !s.Allowed || s.Remaining < 0 || s.Remaining > capacity || s.RetryAfter != 0 {
					t.Fatalf("%s %v: Settle(%q, 0, %d) = %+v, %v; want allowed, Remaining in [0, %d]", a.name, limit, key, n, s, err, capacity)
				}
			}
			if i%4 == 1 {
				g, r, err := d.(budget).AllowAtMost(context.Background(), key, n+repeat%3)
				switch {
				case err != nil:
					if !errors.Is(err, tierlimit.ErrInvalidCost) {
						t.Fatalf("%s %v: AllowAtMost(%q, %d) = %v, want nil or ErrInvalidCost", a.name, limit, key, n+repeat%3, err)
					}
				case g < 0 || g > min(n+repeat%3, capacity) || r.Allowed != (g > 0) || r.Allowed != (r.RetryAfter == 0) ||
					r.Remaining < 0 || r.Remaining > capacity || r.ResetAfter < 0:
					t.Fatalf("%s %v: AllowAtMost(%q, %d) = %d, %+v", a.name, limit, key, n+repeat%3, g, r)
				}
			}
			if i%3 == 2 {
				r, err := d.(tenant).AllowAll(context.Background(), tierlimit.Take{Key: key, N: n}, tierlimit.Take{Key: "other", N: 1})
				if err != nil && !errors.Is(err, tierlimit.ErrInvalidCost) {
					t.Fatalf("%s %v: AllowAll(%q %d, other 1) = %v, want nil or ErrInvalidCost", a.name, limit, key, n, err)
				}
				if err == nil && (r.Remaining < 0 || r.Remaining > capacity || r.Allowed != (r.RetryAfter == 0)) {
					t.Fatalf("%s %v: AllowAll(%q %d, other 1) = %+v", a.name, limit, key, n, r)
				}
			}
			if stepMicros > 0 {
				now = now.Add(time.Duration(stepMicros%(1<<40)) * time.Microsecond)
				m.SetTime(now)
			}
		}
	})
}
