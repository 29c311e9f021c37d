package remote

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/place"
	"github.com/tierlimit/tierlimit/internal/store"
	"github.com/tierlimit/tierlimit/internal/wait"
)

// limiter is what every limiter of the package is: the engine that runs
// its script (internal/store), behind the methods users call, and the
// lines of WaitN's waiters.
type limiter struct {
	s     *store.Limiter
	lines wait.Lines
	// cluster: an AllowAll may charge several slots, and give back what
	// a later one refuses, so it runs to its end whatever its context.
	cluster bool
	// honours: the client ends a call at its context's deadline itself
	// (detach.Honours), so a call with a deadline needs no goroutine.
	honours bool
}

// newLimiter makes the limiter of alg for constructor by (its name, for
// the errors of two limiters on one prefix).
func newLimiter(by string, rdb redis.UniversalClient, alg *store.Algorithm, limit tierlimit.Limit, opts []Option) (*limiter, error) {
	cfg := store.Config{Prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("remote: %w: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, named(err)
		}
	}
	s, err := store.New(rdb, alg, limit, cfg)
	if err != nil {
		return nil, named(err)
	}
	l := &limiter{s: s, honours: detach.Honours(rdb)}
	_, l.cluster = rdb.(*redis.ClusterClient)
	prefix := cfg.Prefix
	if prefix == "" { // store's keys then begin with the default
		prefix = DefaultPrefix
	}
	if _, err := place.Take(l, by, rdb, prefix, alg.Name(), place.Limits(limit, cfg.Extra)); err != nil {
		return nil, named(err)
	}
	return l, nil
}

// named returns err as remote's callers see it (check.Named).
func named(err error) error { return check.Named("remote", err) }

// AllowN reports whether n events may happen now for key, and charges them
// if so. n == 0 peeks: it charges nothing and is allowed, with Remaining
// telling what is left, but on a TokenBucket or GCRA key in debt (Settle),
// where it is denied with the wait until the debt is repaid. A key WithLimitFunc's function blocks
// (tierlimit.Blocked) is denied, peeks too, without a call to Redis.
func (l *limiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	res, err := detach.Call(l.honours, ctx, func(ctx context.Context) (tierlimit.Result, error) { return l.s.AllowN(ctx, key, n) })
	if err != nil {
		return res, named(err)
	}
	return res, nil
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowAll decides several keys at once, all-or-nothing: each take's Key is
// charged its N under each of the key's limits (WithLimitFunc's or the
// constructor's, and every WithLimits) only if every one admits it. A
// refused call charges no key. The Result is the most restrictive take's:
// on admission the smallest Remaining, on denial the largest RetryAfter
// (of the slot that refused, in a Cluster). Duplicate keys add up. No
// takes, more than tierlimit.MaxTakes keys, a negative N or a take above
// its key's capacity is tierlimit.ErrInvalidCost, a bad key
// tierlimit.ErrInvalidKey, a bad
// WithLimitFunc answer tierlimit.ErrInvalidLimit, all before any call. A
// take of a key the WithLimitFunc function blocks (tierlimit.Blocked)
// denies the whole call, without a call to Redis: no key is charged.
//
// Keys that share a Redis Cluster slot, and all keys on a single Redis,
// are decided in one script call, atomically. With keys in several slots,
// AllowAll decides one slot after another, in slot order, and when a
// later slot refuses it gives back, before it returns, exactly what the
// earlier slots charged (capped at capacity: refill that came meanwhile is
// not given twice). So a refused call returns having charged nothing, but
// other callers may briefly see its charges on the earlier slots. If
// Redis fails while giving back, the error says which keys were left
// charged and by how much.
func (l *limiter) AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error) {
	f := func(ctx context.Context) (tierlimit.Result, error) { return l.s.AllowAll(ctx, takes...) }
	if l.cluster {
		res, err := detach.Run(ctx, f)
		return res, named(err)
	}
	res, err := detach.Call(l.honours, ctx, f)
	return res, named(err)
}

// WaitN blocks until n events may happen for key, charges them and returns
// the admitting Result. Waiters on one key in this process queue first
// come, first served, and only the first of them asks Redis, once per
// RetryAfter: a crowd of waiters costs Redis no more calls than one. It
// returns at once an error wrapping tierlimit.ErrWaitDeadline when the
// wait would pass ctx's deadline, or when key is blocked (WithLimitFunc's
// function answers tierlimit.Blocked, at the start or during the wait: no
// wait ends; with the blocked Result), ctx's error when ctx ends first, and
// AllowN's errors (bad input is reported before any wait).
func (l *limiter) WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := l.s.Check(key, n); err != nil {
		return tierlimit.Result{}, named(err)
	}
	res, err := l.lines.N(ctx, key, func() (tierlimit.Result, error) {
		return detach.Call(l.honours, ctx, func(ctx context.Context) (tierlimit.Result, error) { return l.s.AllowN(ctx, key, n) })
	})
	return res, named(err)
}

// Settle corrects an earlier charge of key: it was charged charged and
// really used used (say an LLM request charged its estimate, then its
// real cost). The difference is given back when charged > used, up to full
// at most, or taken when used > charged, under each of the key's limits in
// one round trip; it is never denied (the events happened). TokenBucket
// and GCRA take what the key lacks into debt, down to minus its capacity
// at most, rather than forgive tokens really used: a key in debt is denied
// every cost, peeks included, with a RetryAfter (and ResetAfter) that
// counts the debt exactly, until the rate has repaid it; Remaining is
// never negative. The window algorithms keep no debt: their count stays
// within [0, Rate], so what the window lacks is forgiven. used may exceed
// the capacity (an upload larger than the bucket): what a limit could not
// take, past its floor or its full window, is the Result's Uncharged (the
// most of any of the key's limits), the rest is charged. charged must be
// between 0 and the key's capacity (it was admitted), used at least 0,
// else tierlimit.ErrInvalidCost. The Result is Allowed, with Remaining after;
// for a key WithLimitFunc's function blocks, Settle changes nothing and
// returns the blocked Result (not Allowed, Limit tierlimit.Blocked).
func (l *limiter) Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	res, err := detach.Call(l.honours, ctx, func(ctx context.Context) (tierlimit.Result, error) { return l.s.Settle(ctx, key, charged, used) })
	return res, named(err)
}

// AllowAtMost takes between 1 and n tokens for key, as many as it holds
// whole under every one of its limits (a batch consumer takes up to n
// messages), in one round trip, and returns how many with the Result:
// Allowed, Remaining what is left. When a limit holds less than one whole
// token (a part of one, debt from Settle, or a full window), it takes none
// and returns 0 with a denial whose RetryAfter is the exact wait for one
// (the largest over the key's limits). n may exceed the key's capacity, up
// to tierlimit.MaxRate; n < 1 or above is tierlimit.ErrInvalidCost, a bad
// key tierlimit.ErrInvalidKey, a bad WithLimitFunc answer
// tierlimit.ErrInvalidLimit, all before any call. A key the WithLimitFunc
// function blocks (tierlimit.Blocked) is granted 0 with the blocked
// Result, without a call. WithObserver sees a Decision of N = granted, or
// n when denied.
func (l *limiter) AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	type took struct {
		granted int64
		res     tierlimit.Result
	}
	t, err := detach.Call(l.honours, ctx, func(ctx context.Context) (took, error) {
		granted, res, err := l.s.AllowAtMost(ctx, key, n)
		return took{granted, res}, err
	})
	return t.granted, t.res, named(err)
}

// LimitFor returns the limit key is decided under: WithLimitFunc's answer
// for it, or the constructor's limit when there is none or it is the zero
// Limit (WithLimits' limits apply besides); tierlimit.Blocked for a key the
// function blocks. It returns an error wrapping tierlimit.ErrInvalidKey for
// a bad key and tierlimit.ErrInvalidLimit for an answer that is neither
// Blocked nor valid for the algorithm. It makes no call to Redis.
func (l *limiter) LimitFor(key string) (tierlimit.Limit, error) {
	lim, err := l.s.LimitFor(key)
	return lim, named(err)
}

// Reset forgets key's state under every limit: the key is back to full capacity.
func (l *limiter) Reset(ctx context.Context, key string) error {
	_, err := detach.Call(l.honours, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, l.s.Reset(ctx, key) })
	return named(err)
}

// Eviction returns what the Redis server said about evicting keys when last
// read: at New (within NewTimeout), then about once a minute while the
// limiter is used, on a goroutine of its own. Each reading that differs in
// risk is reported to WithObserver's Eviction, and logged (log/slog) when
// it becomes risky or unknown.
func (l *limiter) Eviction() tierlimit.EvictionRisk { return l.s.Eviction() }
