package tierlimit_test

import (
	"errors"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

func TestLimitValidate(t *testing.T) {
	tests := []struct {
		name  string
		limit tierlimit.Limit
		ok    bool
	}{
		{"per second", tierlimit.PerSecond(10), true},
		{"per minute with burst", tierlimit.PerMinute(100).WithBurst(500), true},
		{"per hour", tierlimit.PerHour(5), true},
		{"per day million", tierlimit.PerDay(1_000_000), true},
		{"one per microsecond", tierlimit.Limit{Rate: 1, Period: time.Microsecond}, true},
		{"zero value", tierlimit.Limit{}, false},
		{"zero rate", tierlimit.Limit{Rate: 0, Period: time.Second}, false},
		{"negative rate", tierlimit.Limit{Rate: -1, Period: time.Second}, false},
		{"zero period", tierlimit.Limit{Rate: 1}, false},
		{"negative period", tierlimit.Limit{Rate: 1, Period: -time.Second}, false},
		{"negative burst", tierlimit.PerSecond(1).WithBurst(-1), false},
		{"sub-microsecond period", tierlimit.Limit{Rate: 1, Period: 999 * time.Nanosecond}, false},
		{"fractional microseconds", tierlimit.Limit{Rate: 1, Period: 1500 * time.Nanosecond}, false},
		{"many per microsecond", tierlimit.PerSecond(1_000_001), true},
		{"100 MB/s", tierlimit.PerSecond(100_000_000), true},
		{"1 Gbit/s in bytes", tierlimit.PerSecond(125_000_000), true},
		{"10 GB/s", tierlimit.PerSecond(10_000_000_000), true},
		{"10^12 per second", tierlimit.PerSecond(1_000_000_000_000), true},
		{"burst 10^12", tierlimit.PerSecond(1_000_000_000).WithBurst(1_000_000_000_000), true},
		{"prime daily", tierlimit.PerDay(1_000_003), true},
		{"larger prime daily", tierlimit.PerDay(10_000_019), true},
		{"prime per 30 days", tierlimit.Limit{Rate: 1_000_003, Period: 30 * 24 * time.Hour}, true},
		{"one per 400 days", tierlimit.Limit{Rate: 1, Period: 400 * 24 * time.Hour}, true},
		{"7 per millisecond", tierlimit.Limit{Rate: 7, Period: time.Millisecond}, true},
		{"max rate per microsecond", tierlimit.Limit{Rate: tierlimit.MaxRate, Period: time.Microsecond}, true},
		{"above max rate", tierlimit.Limit{Rate: tierlimit.MaxRate + 1, Period: time.Second}, false},
		{"above max burst", tierlimit.PerSecond(tierlimit.MaxRate).WithBurst(tierlimit.MaxRate + 1), false},
		{"max period", tierlimit.Limit{Rate: 1, Period: tierlimit.MaxPeriod}, true},
		{"above max period", tierlimit.Limit{Rate: 1, Period: tierlimit.MaxPeriod + time.Microsecond}, false},
		{"fills in MaxFill", tierlimit.PerSecond(1).WithBurst(int64(tierlimit.MaxFill / time.Second)), true},
		{"fills after MaxFill", tierlimit.PerSecond(1).WithBurst(int64(tierlimit.MaxFill/time.Second) + 1), false},
		{"max rate", tierlimit.Limit{Rate: math.MaxInt64, Period: time.Second}, false},
		{"max duration period", tierlimit.Limit{Rate: 1, Period: math.MaxInt64 / 1000 * 1000}, false},
		{"max burst", tierlimit.PerSecond(1).WithBurst(math.MaxInt64), false},
		{"fills in 3000 years", tierlimit.PerDay(999_983).WithBurst(1 << 40), false},
		{"max burst of a slow rate", tierlimit.Limit{Rate: 1, Period: tierlimit.MaxPeriod, Burst: tierlimit.MaxRate}, false},
		{"min int64", tierlimit.Limit{Rate: math.MinInt64, Period: math.MinInt64, Burst: math.MinInt64}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.limit.Validate()
			if tt.ok && err != nil {
				t.Fatalf("%v.Validate() = %v, want nil", tt.limit, err)
			}
			if !tt.ok && !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Fatalf("%v.Validate() = %v, want ErrInvalidLimit", tt.limit, err)
			}
		})
	}
}

func TestLimitHelpers(t *testing.T) {
	l := tierlimit.PerMinute(30)
	if got, want := l.Capacity(), int64(30); got != want {
		t.Errorf("Capacity() = %d, want %d", got, want)
	}
	if got, want := l.WithBurst(90).Capacity(), int64(90); got != want {
		t.Errorf("WithBurst(90).Capacity() = %d, want %d", got, want)
	}
	if got, want := l.Every(), 2*time.Second; got != want {
		t.Errorf("Every() = %v, want %v", got, want)
	}
	if got, want := l.WithBurst(90).String(), "30/1m0s burst 90"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	unit, per := tierlimit.PerSecond(4).Scale()
	if unit != 250_000 || per != 1 {
		t.Errorf("PerSecond(4).Scale() = %d, %d, want 250000, 1", unit, per)
	}
}

func TestCheckCost(t *testing.T) {
	l := tierlimit.PerSecond(5)
	for _, n := range []int64{-1, 6, math.MaxInt64, math.MinInt64} {
		if err := l.CheckCost(n); !errors.Is(err, tierlimit.ErrInvalidCost) {
			t.Errorf("CheckCost(%d) = %v, want ErrInvalidCost", n, err)
		}
	}
	for _, n := range []int64{0, 1, 5} {
		if err := l.CheckCost(n); err != nil {
			t.Errorf("CheckCost(%d) = %v, want nil", n, err)
		}
	}
}

func TestSourceString(t *testing.T) {
	for s, want := range map[tierlimit.Source]string{
		tierlimit.SourceRemote: "remote", tierlimit.SourceLocal: "local",
		tierlimit.SourceBlocked: "blocked", tierlimit.SourceFallback: "fallback", 99: "unknown",
	} {
		if got := s.String(); got != want {
			t.Errorf("Source(%d).String() = %q, want %q", s, got, want)
		}
	}
}

// FuzzLimit checks Validate against the ranges it documents, computed in
// big integers: it never panics, refuses with ErrInvalidLimit, and accepts
// every limit within them, whose Scale keeps the rate and whose empty bucket
// (xrate, the in-process tiers' exact bucket) waits exactly
// ceil(n·Period/Rate) for n tokens.
func FuzzLimit(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(0))
	f.Add(int64(999_983), int64(24*time.Hour), int64(1<<40))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(int64(1), int64(1), int64(-1))
	f.Add(int64(100_000_000), int64(time.Second), int64(0))
	f.Add(int64(125_000_000), int64(time.Second), int64(0))
	f.Add(int64(1_000_000_000_000), int64(time.Second), int64(1_000_000_000_000))
	f.Add(int64(1_000_003), int64(24*time.Hour), int64(0))
	f.Add(int64(10_000_019), int64(24*time.Hour), int64(0))
	f.Add(int64(1_000_003), int64(30*24*time.Hour), int64(0))
	f.Add(int64(1), int64(400*24*time.Hour), int64(0))
	f.Add(int64(7), int64(time.Millisecond), int64(0))
	f.Add(int64(tierlimit.MaxRate), int64(time.Microsecond), int64(tierlimit.MaxRate))
	f.Add(int64(3), int64(tierlimit.MaxPeriod), int64(2))
	f.Fuzz(func(t *testing.T, rate, period, burst int64) {
		l := tierlimit.Limit{Rate: rate, Period: time.Duration(period), Burst: burst}
		err := l.Validate()
		if want := inRange(l); (err == nil) != want {
			t.Fatalf("%v.Validate() = %v, want valid %v", l, err, want)
		}
		if err != nil {
			if !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Fatalf("Validate() = %v, want ErrInvalidLimit", err)
			}
			return
		}
		unit, per := l.Scale()
		if unit <= 0 || per <= 0 {
			t.Fatalf("Scale() = %d, %d for valid %v", unit, per, l)
		}
		if new(big.Int).Mul(big.NewInt(unit), big.NewInt(l.Rate)).Cmp(new(big.Int).Mul(big.NewInt(per), big.NewInt(l.PeriodMicros()))) != 0 {
			t.Fatalf("Scale() = %d, %d does not keep the rate of %v", unit, per, l)
		}
		t0 := time.Unix(1_700_000_000, 0)
		b := xrate.NewWith(l, 0, t0)
		for _, n := range []int64{1, l.Capacity()} {
			res := b.Decide(t0, n)
			if want := time.Duration(ceilMicros(n, l)) * time.Microsecond; res.Allowed || res.RetryAfter != want {
				t.Fatalf("empty %v: Decide(%d) = %v, RetryAfter %v, want false, %v", l, n, res.Allowed, res.RetryAfter, want)
			}
		}
	})
}

// inRange reports whether l is within the ranges Validate documents.
func inRange(l tierlimit.Limit) bool {
	if l.Rate < 1 || l.Rate > tierlimit.MaxRate || l.Burst < 0 || l.Burst > tierlimit.MaxRate ||
		l.Period < time.Microsecond || l.Period > tierlimit.MaxPeriod || l.Period%time.Microsecond != 0 {
		return false
	}
	return ceilMicros(l.Capacity(), l) <= int64(tierlimit.MaxFill/time.Microsecond)
}

// ceilMicros returns ceil(n·Period/Rate) in µs, computed in big integers
// (saturated at MaxInt64).
func ceilMicros(n int64, l tierlimit.Limit) int64 {
	x := new(big.Int).Mul(big.NewInt(n), big.NewInt(l.PeriodMicros()))
	x.Add(x, big.NewInt(l.Rate-1))
	x.Quo(x, big.NewInt(l.Rate))
	if !x.IsInt64() {
		return math.MaxInt64
	}
	return x.Int64()
}

func TestRefillTime(t *testing.T) {
	tests := []struct {
		limit tierlimit.Limit
		n     int64
		want  time.Duration
	}{
		{tierlimit.PerSecond(10), 1, 100 * time.Millisecond},
		{tierlimit.PerSecond(10), 0, 0},
		{tierlimit.PerSecond(3), 1, 333333334}, // rounded up
		{tierlimit.PerSecond(1_000_000_000_000), 1, 1},
		{tierlimit.PerSecond(1_000_000_000_000), 1_000_000_000_000, time.Second},
		{tierlimit.PerDay(1_000_003), 1_000_003, 24 * time.Hour},
		{tierlimit.PerDay(1_000_003), 1, 86399741}, // ceil(86400e9/1000003)
		{tierlimit.Limit{Rate: 1, Period: 400 * 24 * time.Hour}, 1, 400 * 24 * time.Hour},
		{tierlimit.Limit{Rate: 1, Period: tierlimit.MaxPeriod}, 1 << 20, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := tt.limit.RefillTime(tt.n); got != tt.want {
			t.Errorf("%v.RefillTime(%d) = %d, want %d", tt.limit, tt.n, got, tt.want)
		}
	}
}

// TestIsBlocked: the blocked limit is recognised by its value, whatever
// the exported variable holds.
func TestIsBlocked(t *testing.T) {
	tests := []struct {
		l    tierlimit.Limit
		want bool
	}{
		{tierlimit.Blocked, true},
		{tierlimit.Limit{Burst: -1}, true},
		{tierlimit.Limit{}, false},
		{tierlimit.PerSecond(1), false},
		{tierlimit.PerSecond(1).WithBurst(-1), false},
		{tierlimit.Limit{Burst: -2}, false},
	}
	for _, tc := range tests {
		if got := tc.l.IsBlocked(); got != tc.want {
			t.Errorf("%#v.IsBlocked() = %v, want %v", tc.l, got, tc.want)
		}
	}
}
