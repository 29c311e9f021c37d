package tierlimit

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// The ranges Validate accepts. Redis Lua numbers are float64, exact for
// integers below 2^53: within these ranges every quantity the scripts hold
// stays below that, and products that would not (a refill's elapsed time
// × Rate, a wait's tokens × Period) go through lib.lua's muldiv, exact
// for divisors up to 2^51.
const (
	// MaxRate bounds Rate and Burst: 10^15 (a petabyte a second, counted
	// in bytes), below 2^50.
	MaxRate = 1_000_000_000_000_000
	// MaxPeriod bounds Period: 2^50 µs, about 35 years.
	MaxPeriod = (1 << 50) * time.Microsecond
	// MaxFill bounds the time an empty bucket takes to fill,
	// Capacity × Period / Rate: 2^51 µs, about 71 years. Waits, TTLs and
	// the clock plus a wait then stay below 2^53 µs, and a ResetAfter fits
	// a time.Duration.
	MaxFill = (1 << 51) * time.Microsecond
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

// Validate reports whether l is a limit: what every tier accepts, exactly
// (an algorithm may refuse more in its constructor, saying why). Its error
// wraps [ErrInvalidLimit] and says which rule failed:
//
//   - Rate from 1 to [MaxRate], Burst from 0 to MaxRate;
//   - Period from 1 µs to [MaxPeriod], a whole number of microseconds;
//   - an empty bucket fills within [MaxFill]: Capacity × Period / Rate.
//
// Any integer Rate is exact, however many events a microsecond holds and
// whatever factors it shares with Period.
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
	case l.Period > MaxPeriod:
		return fmt.Errorf("%w: period %v is longer than %v", ErrInvalidLimit, l.Period, MaxPeriod)
	case l.Rate > MaxRate:
		return fmt.Errorf("%w: rate %d is above %d", ErrInvalidLimit, l.Rate, int64(MaxRate))
	case l.Burst > MaxRate:
		return fmt.Errorf("%w: burst %d is above %d", ErrInvalidLimit, l.Burst, int64(MaxRate))
	}
	// Capacity × Period <= MaxFill × Rate, in 128 bits: both sides pass
	// int64 within the ranges above.
	hi, lo := bits.Mul64(uint64(l.Capacity()), uint64(l.PeriodMicros()))
	mhi, mlo := bits.Mul64(uint64(MaxFill/time.Microsecond), uint64(l.Rate))
	if hi > mhi || hi == mhi && lo > mlo {
		return fmt.Errorf("%w: %v takes more than %v to fill an empty bucket of %d", ErrInvalidLimit, l, MaxFill, l.Capacity())
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

// RefillTime returns how long the limit's bucket takes to refill n tokens:
// ceil(n·Period/Rate), to the nanosecond, exact for every valid limit
// (math.MaxInt64 past what a Duration holds; 0 for n <= 0).
func (l Limit) RefillTime(n int64) time.Duration {
	if n <= 0 || l.Rate <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(n), uint64(l.Period))
	var c uint64
	lo, c = bits.Add64(lo, uint64(l.Rate)-1, 0)
	hi += c
	if hi >= uint64(l.Rate) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(l.Rate))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(q)
}

// Every returns the time between two events at the limit's steady rate,
// rounded down to the nanosecond: 0 for more than one event a nanosecond.
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
