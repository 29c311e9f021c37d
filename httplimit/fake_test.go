package httplimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// fakeLimiter admits Capacity events per key, ever, and reports fixed
// RetryAfter and ResetAfter: deterministic answers for checking what the
// middleware does with them. It is safe for concurrent use.
type fakeLimiter struct {
	limit        tierlimit.Limit
	limitOf      tierlimit.LimitFunc // a key's own limit, as WithLimitFunc gives it; nil or zero: limit
	retry, reset time.Duration
	err          error // returned by every call when set

	mu    sync.Mutex
	used  map[string]int64
	calls []call
}

// call is one AllowN the fake answered.
type call struct {
	key string
	n   int64
}

func newFake(limit tierlimit.Limit, retry, reset time.Duration) *fakeLimiter {
	return &fakeLimiter{limit: limit, retry: retry, reset: reset, used: map[string]int64{}}
}

func (f *fakeLimiter) AllowN(_ context.Context, key string, n int64) (tierlimit.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{key, n})
	if f.err != nil {
		return tierlimit.Result{}, f.err
	}
	if err := check.Key(key); err != nil {
		return tierlimit.Result{}, err
	}
	limit := f.limit
	if f.limitOf != nil {
		if l := f.limitOf(key); l != (tierlimit.Limit{}) {
			limit = l
		}
	}
	if err := limit.CheckCost(n); err != nil {
		return tierlimit.Result{}, err
	}
	left := limit.Capacity() - f.used[key]
	res := tierlimit.Result{Limit: limit, ResetAfter: f.reset, Source: tierlimit.SourceLocal}
	if n > left {
		res.Remaining, res.RetryAfter = left, f.retry
		return res, nil
	}
	f.used[key] += n
	res.Allowed, res.Remaining = true, left-n
	return res, nil
}

// charged returns the tokens key was charged.
func (f *fakeLimiter) charged(key string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used[key]
}

// asked returns the calls made so far.
func (f *fakeLimiter) asked() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func (c call) String() string { return fmt.Sprintf("AllowN(%q, %d)", c.key, c.n) }

// settlingFake is a fakeLimiter that can give a charge back, as every
// tier's limiter can.
type settlingFake struct{ *fakeLimiter }

func (f settlingFake) Settle(_ context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used[key] = max(0, f.used[key]-(charged-used))
	return tierlimit.Result{Allowed: true, Limit: f.limit, Remaining: f.limit.Capacity() - f.used[key]}, nil
}
