package tierlimit

import (
	"fmt"
	"time"
)

// Redis Lua numbers are float64, exact for integers below 2^53. Validate
// keeps every quantity the scripts add up below that: a period of at most
// 2^50 µs (35 years) and a bucket of at most 2^51 units.
const (
	maxPeriodMicros = 1 << 50
	maxUnits        = 1 << 51
)

// Limit is a rate: Rate events per Period, with a bucket of Burst tokens.
// The zero value is not a valid Limit; build one with [PerSecond] and its
// siblings, or fill the fields and call [Limit.Validate].
//
// A Limit is a small value: copy it freely.
type Limit struct {
	Rate   int64         // events allowed per Period; > 0
	Period time.Duration // > 0, a whole number of microseconds
	Burst  int64         // bucket capacity; 0 means Rate
}

// PerSecond returns a Limit of rate events per second, with Burst equal to rate.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a Limit of rate events per minute, with Burst equal to rate.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a Limit of rate events per hour, with Burst equal to rate.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Period: time.Hour} }

// PerDay returns a Limit of rate events per 24 hours, with Burst equal to rate.
func PerDay(rate int64) Limit { return Limit{Rate: rate, Period: 24 * time.Hour} }

// WithBurst returns a copy of l whose bucket holds burst tokens.
func (l Limit) WithBurst(burst int64) Limit {
	l.Burst = burst
	return l
}

// Capacity returns the bucket size: Burst, or Rate when Burst is 0.
func (l Limit) Capacity() int64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// PeriodMicros returns Period in whole microseconds.
func (l Limit) PeriodMicros() int64 { return int64(l.Period / time.Microsecond) }

// Scale returns the integer units the token bucket counts in: one token is
// unit units, and every microsecond refills perMicro units. Both are Period
// (in µs) and Rate divided by their greatest common divisor, so that the
// scripts' arithmetic is exact. Scale assumes l is valid.
func (l Limit) Scale() (unit, perMicro int64) {
	p := l.PeriodMicros()
	g := gcd(p, l.Rate)
	return p / g, l.Rate / g
}

// Validate reports whether l can be enforced exactly by every tier. Its error
// wraps [ErrInvalidLimit] and says which rule failed:
//
//   - Rate > 0, Burst >= 0, Period > 0 and a whole number of microseconds;
//   - at most one event per microsecond (the scripts' time resolution);
//   - Period at most 2^50 µs, and Capacity times one token's units (see
//     [Limit.Scale]) at most 2^51, so that the scripts' float64 arithmetic
//     stays exact.
func (l Limit) Validate() error {
	switch {
	case l.Rate <= 0:
		return fmt.Errorf("%w: rate %d must be > 0", ErrInvalidLimit, l.Rate)
	case l.Burst < 0:
		return fmt.Errorf("%w: burst %d must be >= 0", ErrInvalidLimit, l.Burst)
	case l.Period <= 0:
		return fmt.Errorf("%w: period %v must be > 0", ErrInvalidLimit, l.Period)
	case l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrInvalidLimit, l.Period)
	case l.PeriodMicros() > maxPeriodMicros:
		return fmt.Errorf("%w: period %v is too long", ErrInvalidLimit, l.Period)
	case l.Rate > l.PeriodMicros():
		return fmt.Errorf("%w: %d per %v is finer than one event per microsecond", ErrInvalidLimit, l.Rate, l.Period)
	}
	unit, _ := l.Scale()
	if l.Capacity() > maxUnits/unit {
		return fmt.Errorf("%w: burst %d × %d units per token passes 2^51 (use a shorter period, or a rate sharing more factors with it)",
			ErrInvalidLimit, l.Capacity(), unit)
	}
	return nil
}

// CheckCost reports whether a request of cost n can ever be admitted by l:
// n must be between 0 and Capacity. Its error wraps [ErrInvalidCost].
func (l Limit) CheckCost(n int64) error {
	switch {
	case n < 0:
		return fmt.Errorf("%w: n %d must be >= 0", ErrInvalidCost, n)
	case n > l.Capacity():
		return fmt.Errorf("%w: n %d exceeds burst %d", ErrInvalidCost, n, l.Capacity())
	}
	return nil
}

// Every returns the time between two events at the limit's steady rate.
func (l Limit) Every() time.Duration { return l.Period / time.Duration(l.Rate) }

// String formats l as "rate/period" with the burst when it differs from Rate,
// e.g. "10/1s" or "10/1s burst 50".
func (l Limit) String() string {
	if l.Burst == 0 || l.Burst == l.Rate {
		return fmt.Sprintf("%d/%v", l.Rate, l.Period)
	}
	return fmt.Sprintf("%d/%v burst %d", l.Rate, l.Period, l.Burst)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
