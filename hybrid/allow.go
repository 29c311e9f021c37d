package hybrid

// AllowN: a decision from the key's lease or known block in process, else a
// claim.

import (
	"context"
	"fmt"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and takes them if
// so. n == 0 peeks. It returns an error only for bad input (wrapping
// tierlimit.ErrInvalidKey or tierlimit.ErrInvalidCost), a cancelled ctx, or
// tierlimit.ErrClosed after Close. Redis faults never reach the caller: the
// call is decided by the failure mode (see WithFailureMode). Redis refusing
// the limiter's commands (see tierlimit.Misconfigured) is not a fault but a
// misconfiguration: from the first such reply until a call succeeds again,
// AllowN returns an error wrapping tierlimit.ErrMisconfigured instead of
// deciding on its fallback.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	var res tierlimit.Result
	var err error
	if l.onDecision != nil {
		err = l.observed(ctx, &res, key, n)
	} else {
		err = l.decide(ctx, &res, key, n)
	}
	if err != nil {
		return res, named(err)
	}
	return res, nil
}

// AllowAtMost takes between 1 and n tokens for key, as many as the key
// holds up to n (a consumer takes up to n messages), and returns how many
// with the Result: Allowed when it granted some; when the key holds not
// one whole token, 0 and a denial whose RetryAfter is the wait for one. n
// may exceed the key's Burst: it must be between 1 and tierlimit.MaxRate
// (tierlimit.ErrInvalidCost). The key's lease answers without a Redis
// call when it holds n, or when Redis is known to hold too few (the key is
// blocked, or in debt); otherwise the call claims what the lease lacks of n
// (at most the key's Burst) from Redis, as AllowN claims, and takes what the
// lease then holds. While Redis cannot answer, the key's fallback bucket
// grants what it holds. The errors
// are AllowN's. A decision is reported to the observer with N the tokens
// granted (n when denied).
func (l *Limiter) AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	got, res, err := l.allowAtMost(ctx, key, n)
	if err != nil {
		return 0, res, named(err)
	}
	return got, res, nil
}

func (l *limiter) allowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	if err := l.check(ctx, key, 0); err != nil {
		return 0, tierlimit.Result{}, err
	}
	if err := check.AtMost(n); err != nil {
		return 0, tierlimit.Result{}, fmt.Errorf("%w (key %q)", err, key)
	}
	h := keyHash(key)
	var took time.Duration
	var res tierlimit.Result
	got, ok := l.inProcess(&res, key, h, 1, n)
	if !ok {
		var start time.Time
		if l.onDecision != nil {
			start = time.Now()
		}
		var err error
		if res, got, err = l.slow(ctx, key, h, 1, n); err != nil {
			return 0, res, err
		}
		if l.onDecision != nil {
			took = time.Since(start)
		}
	}
	if l.onDecision != nil {
		d := tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: got, Latency: took, Limit: res.Limit}
		if !res.Allowed {
			d.N = n
		}
		l.onDecision(d)
	}
	return got, res, nil
}

// named returns err as hybrid's callers see it (check.Named).
func named(err error) error { return check.Named("hybrid", err) }

// observed is decide, then reports the decision to the observer. A
// decision made in process (a lease, a known-blocked key) is reported with
// Latency 0: it takes well under a microsecond, and two clock reads would
// cost more than it does (otelbridge's BenchmarkHotKey).
func (l *limiter) observed(ctx context.Context, res *tierlimit.Result, key string, n int64) error {
	if err := l.check(ctx, key, n); err != nil {
		return err
	}
	h := keyHash(key)
	var took time.Duration
	if _, ok := l.inProcess(res, key, h, n, n); !ok {
		start := time.Now()
		var err error
		if *res, _, err = l.slow(ctx, key, h, n, n); err != nil {
			return err
		}
		took = time.Since(start)
	}
	l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Latency: took, Limit: res.Limit})
	return nil
}

// decide is AllowN writing its Result into res, which AllowN returns: a
// decision made in process writes it once, where it is made, rather than
// copy it up through each call (bench/RESULTS.md).
func (l *limiter) decide(ctx context.Context, res *tierlimit.Result, key string, n int64) error {
	if err := l.check(ctx, key, n); err != nil {
		return err
	}
	h := keyHash(key)
	if _, ok := l.inProcess(res, key, h, n, n); ok {
		return nil
	}
	var err error
	*res, _, err = l.slow(ctx, key, h, n, n)
	return err
}

// inProcess decides from key's lease or its known block, if it can (see
// leased): a take of between n and most tokens, and how many it took.
func (l *limiter) inProcess(res *tierlimit.Result, key string, h uint64, n, most int64) (int64, bool) {
	if e, ok := l.keys.find(key, h); ok {
		if l.cfg.lookup.Set() {
			// check knew no key's limit but the default's: a cost above
			// the key's is refused by the claim (checkPolicy), even if an
			// earlier, larger limit left the lease holding it.
			if !e.policy().fits(n) {
				return 0, false
			}
		}
		if most != n && !l.enough(e, n, most) { // AllowN's decision calls nothing more
			return 0, false
		}
		return l.leased(res, e, n, most, tierlimit.SourceLocal, tierlimit.SourceBlocked)
	}
	return 0, false
}

// enough reports whether a take of between n and most tokens of e's key
// is for its lease to decide: an AllowN (n == most), a lease that holds
// most, or a key Redis is known to be short on (its lease's tokens are then
// all the key can give). Otherwise (an AllowAtMost that the lease holds
// only part of) the caller claims the rest: it is granted as many as the
// key holds, up to most, not only what this instance's lease had left.
func (l *limiter) enough(e *entry, n, most int64) bool {
	return most == n || e.tokens.Load() >= most || knownShort(e, l.now())
}

// slow decides with Redis (a claim), or without it when Redis cannot
// answer: a take of between n and most tokens, and how many it took. It is
// a call in flight, which Close waits for.
func (l *limiter) slow(ctx context.Context, key string, h uint64, n, most int64) (tierlimit.Result, int64, error) {
	if !l.keys.enter(h) {
		return tierlimit.Result{}, 0, tierlimit.ErrClosed
	}
	defer l.keys.exit(h)
	return l.claim(ctx, key, h, n, most)
}

func (l *limiter) check(ctx context.Context, key string, n int64) error {
	if l.keys.gate.Closed() {
		return tierlimit.ErrClosed
	}
	if err := check.Key(key); err != nil {
		return err
	}
	// Without a LimitFunc every key's limit is the default's; with one, a
	// key's own limit is checked where the call has it (inProcess,
	// checkPolicy), and only a negative cost here.
	if !l.cfg.lookup.Set() || n < 0 {
		if err := l.def.checkCost(key, n); err != nil {
			return err
		}
	}
	return ctx.Err()
}
