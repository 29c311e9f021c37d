package hybrid

// WaitN: waiting in line for admission.

import (
	"context"

	"github.com/tierlimit/tierlimit"
)

// WaitN blocks until n events may happen for key, takes them and returns the
// admitting Result. Waiters on one key wait in line, first come first
// served, and only the first asks again, once per RetryAfter: a crowd of
// waiters costs Redis no more than one. WaitN returns at once with an error
// wrapping tierlimit.ErrWaitDeadline (and the denying Result) when the wait
// would end after ctx's deadline, ctx's error when ctx ends first, and
// AllowN's errors.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := l.check(ctx, key, n); err != nil {
		return tierlimit.Result{}, named(err)
	}
	res, err := l.waits.N(ctx, key, func() (tierlimit.Result, error) { return l.AllowN(ctx, key, n) })
	return res, named(err)
}
