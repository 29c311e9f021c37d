package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// TokenBucket is a token bucket in Redis: Capacity tokens, refilled at Rate
// per Period, exact in integer arithmetic. It is also the store the hybrid
// tier leases token batches from (Lease, Refund).
//
// A TokenBucket is safe for concurrent use.
type TokenBucket struct{ *limiter }

// NewTokenBucket returns a TokenBucket enforcing limit (and any WithLimits).
// Errors are as for NewGCRA.
func NewTokenBucket(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*TokenBucket, error) {
	l, err := newLimiter(rdb, tokenBucketAlg, limit, opts, 1, 1, 0) // min, want, refund
	if err != nil {
		return nil, err
	}
	return &TokenBucket{l}, nil
}

// AllowN reports whether n tokens may be taken now for key, and takes them
// if so. n == 0 peeks.
func (b *TokenBucket) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := b.check(key, n); err != nil {
		return tierlimit.Result{}, err
	}
	res, _, err := b.call(ctx, key, n, n, 0)
	return res, err
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (b *TokenBucket) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return b.AllowN(ctx, key, 1)
}

// Claim asks Lease for between Min and Want tokens, after giving back Refund
// unspent ones.
type Claim struct {
	Min    int64 // fewest tokens worth taking; fewer available grants none
	Want   int64 // most tokens to take; Min <= Want <= capacity
	Refund int64 // tokens returned first; 0 <= Refund <= capacity
}

// Lease takes between c.Min and c.Want tokens for key in one round trip,
// after refunding c.Refund. It returns the number granted (0 when fewer than
// Min were available) and the Result of the claim: Allowed when granted >=
// Min, with Remaining the tokens left in Redis and RetryAfter the wait until
// Min are available. Granted tokens are debited in Redis before Lease returns.
func (b *TokenBucket) Lease(ctx context.Context, key string, c Claim) (int64, tierlimit.Result, error) {
	if err := b.check(key, c.Want); err != nil {
		return 0, tierlimit.Result{}, err
	}
	if c.Min < 0 || c.Min > c.Want || c.Refund < 0 || c.Refund > b.maxN {
		return 0, tierlimit.Result{}, fmt.Errorf("%w: claim %+v needs 0 <= Min <= Want and 0 <= Refund <= %d",
			tierlimit.ErrInvalidCost, c, b.maxN)
	}
	res, granted, err := b.call(ctx, key, c.Min, c.Want, c.Refund)
	return granted, res, err
}

// Refund gives N unspent tokens back to Key.
type Refund struct {
	Key string
	N   int64 // 0 < N <= capacity
}

// Refund gives tokens back to their buckets, capped at capacity, in one
// pipelined round trip (one per Cluster node). It returns the refunds that
// failed, with the reasons joined in err; the others are applied. Bad input
// fails all of them before any is sent.
func (b *TokenBucket) Refund(ctx context.Context, refunds ...Refund) (failed []Refund, err error) {
	for _, r := range refunds {
		if err := b.check(r.Key, r.N); err != nil {
			return refunds, err
		}
	}
	cmds := b.refund(ctx, refunds, nil)
	// A pipeline does not fall back to EVAL by itself: send again, with
	// EVAL, exactly the refunds the server did not run.
	var again []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		for j, c := range b.refund(ctx, refunds, again) {
			cmds[again[j]] = c
		}
	}
	var errs []error
	for i, c := range cmds {
		if c.Err() != nil {
			failed = append(failed, refunds[i])
			errs = append(errs, fmt.Errorf("remote: refund %d to %q: %w", refunds[i].N, refunds[i].Key, c.Err()))
		}
	}
	return failed, errors.Join(errs...)
}

// refund pipelines the refunds with EVALSHA, or with EVAL those at index in only.
func (b *TokenBucket) refund(ctx context.Context, refunds []Refund, only []int) []*redis.Cmd {
	n := len(refunds)
	if only != nil {
		n = len(only)
	}
	cmds := make([]*redis.Cmd, n)
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			run := b.alg.script.EvalSha
			r := refunds[i]
			if only != nil {
				run, r = b.alg.script.Eval, refunds[only[i]]
			}
			cmds[i] = run(ctx, p, b.redisKeys(r.Key), b.args([]int64{0, 0, r.N})...)
		}
		return nil
	})
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
