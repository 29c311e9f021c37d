package store

import (
	"context"
	"time"

	"github.com/tierlimit/tierlimit"
)

// What a Limiter reports to its observer (Config.Observer).

func (l *Limiter) observed() bool { return l.onDecision != nil || l.onCall != nil }

// observedAllow is AllowN when observed: it reports the Redis call and, if
// it succeeded, the decision.
func (l *Limiter) observedAllow(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	start := time.Now()
	p, err := l.prepare(key, n)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if p == blockedPlan {
		l.reportDecision(blockedResult, n, time.Since(start))
		return blockedResult, nil
	}
	res, _, err := l.decide(ctx, key, p, n)
	lat := time.Since(start)
	if l.onCall != nil {
		l.onCall(tierlimit.RedisCall{Op: "allow", Latency: lat, Err: err})
	}
	if err == nil {
		l.reportDecision(res, n, lat)
	}
	return res, err
}

// reportDecision reports a decision of cost n taken in lat, if observed.
func (l *Limiter) reportDecision(res tierlimit.Result, n int64, lat time.Duration) {
	if l.onDecision != nil {
		l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Latency: lat, Limit: res.Limit})
	}
}

// start returns the time a Redis call starts, for reportCall; the zero
// time when no one observes calls. Latency is measured on the local
// monotonic clock, whatever clock decides.
func (l *Limiter) start() time.Time {
	if l.onCall == nil {
		return time.Time{}
	}
	return time.Now()
}

// reportCall reports a Redis call that began at start, if observed.
func (l *Limiter) reportCall(op string, start time.Time, err error) {
	if l.onCall != nil {
		l.onCall(tierlimit.RedisCall{Op: op, Latency: time.Since(start), Err: err})
	}
}
