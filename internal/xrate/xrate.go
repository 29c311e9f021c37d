// Package xrate decides with a golang.org/x/time/rate limiter and reports
// the decision as a tierlimit.Result: the in-process tiers (local, and
// hybrid's fallback) share it.
package xrate

import (
	"math"
	"time"

	"github.com/tierlimit/tierlimit"
	"golang.org/x/time/rate"
)

// Every returns limit's rate in x/time/rate's terms: events per second.
func Every(limit tierlimit.Limit) rate.Limit {
	return rate.Limit(float64(limit.Rate) / limit.Period.Seconds())
}

// New returns a full x/time/rate limiter of limit.
func New(limit tierlimit.Limit) *rate.Limiter {
	return rate.NewLimiter(Every(limit), int(limit.Capacity()))
}

// NewWith returns an x/time/rate limiter of limit that holds tokens now
// (capped at the burst; at least 0).
func NewWith(limit tierlimit.Limit, tokens int64, now time.Time) *rate.Limiter {
	lim := New(limit)
	if take := limit.Capacity() - max(0, min(tokens, limit.Capacity())); take > 0 {
		lim.AllowN(now, int(take))
	}
	return lim
}

// Decide takes n tokens from lim at now if it holds them (n == 0 peeks),
// where lim follows limit at every events per second with burst tokens,
// and returns the decision with its Remaining, RetryAfter and ResetAfter.
func Decide(limit tierlimit.Limit, every rate.Limit, burst int, lim *rate.Limiter, now time.Time, n int64) tierlimit.Result {
	res := tierlimit.Result{Limit: limit, Source: tierlimit.SourceLocal}
	res.Allowed = n == 0 || n <= int64(burst) && lim.AllowN(now, int(n))
	tokens := lim.TokensAt(now)
	res.Remaining = int64(math.Max(0, math.Floor(tokens)))
	if !res.Allowed {
		res.RetryAfter = wait(every, float64(n)-tokens)
	}
	res.ResetAfter = wait(every, float64(burst)-tokens)
	return res
}

// wait returns the time to refill tokens at every per second, rounded up
// to the microsecond.
func wait(every rate.Limit, tokens float64) time.Duration {
	if tokens <= 0 {
		return 0
	}
	d := time.Duration(math.Ceil(tokens / float64(every) * 1e6))
	return d * time.Microsecond
}
