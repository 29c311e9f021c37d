package tierlimit_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
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
		{"finer than a microsecond", tierlimit.PerSecond(1_000_001), false},
		{"max rate", tierlimit.Limit{Rate: math.MaxInt64, Period: time.Second}, false},
		{"max period", tierlimit.Limit{Rate: 1, Period: math.MaxInt64 / 1000 * 1000}, false},
		{"max burst", tierlimit.PerSecond(1).WithBurst(math.MaxInt64), false},
		{"scaled overflow", tierlimit.PerDay(999_983).WithBurst(1 << 40), false},
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

func TestCheckKeyAndCost(t *testing.T) {
	long := string(make([]byte, tierlimit.MaxKeyLen+1))
	for _, k := range []string{"", long} {
		if err := tierlimit.CheckKey(k); !errors.Is(err, tierlimit.ErrInvalidKey) {
			t.Errorf("CheckKey(%d bytes) = %v, want ErrInvalidKey", len(k), err)
		}
	}
	if err := tierlimit.CheckKey(long[1:]); err != nil {
		t.Errorf("CheckKey(MaxKeyLen bytes) = %v, want nil", err)
	}
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

// FuzzLimit checks that Validate never panics and that a valid limit keeps
// the scripts' arithmetic exact.
func FuzzLimit(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(0))
	f.Add(int64(999_983), int64(24*time.Hour), int64(1<<40))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(int64(1), int64(1), int64(-1))
	f.Fuzz(func(t *testing.T, rate, period, burst int64) {
		l := tierlimit.Limit{Rate: rate, Period: time.Duration(period), Burst: burst}
		if err := l.Validate(); err != nil {
			if !errors.Is(err, tierlimit.ErrInvalidLimit) {
				t.Fatalf("Validate() = %v, want ErrInvalidLimit", err)
			}
			return
		}
		unit, per := l.Scale()
		if unit <= 0 || per <= 0 || per > unit {
			t.Fatalf("Scale() = %d, %d for valid %v", unit, per, l)
		}
		if units := l.Capacity() * unit; units > 1<<51 || units/unit != l.Capacity() {
			t.Fatalf("capacity in units %d overflows for valid %v", units, l)
		}
		if unit*l.Rate != per*l.PeriodMicros() {
			t.Fatalf("Scale() = %d, %d does not keep the rate of %v", unit, per, l)
		}
	})
}
