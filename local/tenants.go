package local

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/front"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// WithLimitFunc gives each key its own limit: f(key), or the Limit passed
// to New (the default, which SetLimit changes) when f returns the zero
// Limit. f is called on every decision: see tierlimit.LimitFunc. When its
// answer for a key changes, the key keeps its state: the tokens it holds,
// capped at the new burst, and the part of the next one, refilled under
// the old limit up to the change and under the new one after it. A call
// for a key whose f gives an invalid limit returns an error wrapping
// tierlimit.ErrInvalidLimit and changes nothing. A key f gives
// tierlimit.Blocked is denied by every call, peeks included, without
// charging it or touching its state: Result{Limit: tierlimit.Blocked,
// Source: tierlimit.SourceBlocked}, RetryAfter 0 (no promise).
func WithLimitFunc(f tierlimit.LimitFunc) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return fmt.Errorf("local: %w: nil limit func", tierlimit.ErrInvalidOption)
		}
		c.limitFunc = f
		return nil
	})
}

// WithLimitLookup gives each key its own limit as WithLimitFunc does, from
// f, which may fail (see tierlimit.LimitLookup). A call whose key's lookup
// fails returns an error wrapping tierlimit.ErrLimitLookup and f's error,
// and changes nothing: the key is not decided under the default, unless
// WithLookupFailOpen says so. f is called on every decision. It may not
// be given with WithLimitFunc.
func WithLimitLookup(f tierlimit.LimitLookup) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return fmt.Errorf("local: %w: nil limit lookup", tierlimit.ErrInvalidOption)
		}
		c.lookup = f
		return nil
	})
}

// WithLookupFailOpen decides a key whose WithLimitLookup lookup fails
// under the default limit (Limit), as if the lookup had answered the zero
// Limit, instead of returning an error (the default: fail closed). It
// needs WithLimitLookup.
func WithLookupFailOpen() Option {
	return optionFunc(func(c *config) error {
		c.open = true
		return nil
	})
}

// limitOf returns key's limit: the lookup's answer, or the default. The
// answer is not validated here: a bucket checks a limit when it changes
// to it, and tierlimit.Blocked is the callers' to test. Its error is a
// failed lookup's (check.Lookup).
func (l *Limiter) limitOf(key string) (tierlimit.Limit, error) {
	if l.lookup.Set() {
		limit, err := l.lookup.Limit(key)
		if err != nil {
			return tierlimit.Limit{}, err
		}
		if limit != (tierlimit.Limit{}) {
			return limit, nil
		}
	}
	return *l.def.Load(), nil
}

// LimitFor returns the limit key is decided under: WithLimitFunc's (or
// WithLimitLookup's) answer for it, or the default (Limit) when there is
// none or it is the zero Limit; tierlimit.Blocked for a key the function
// blocks. It returns an error wrapping tierlimit.ErrInvalidKey for a bad
// key, tierlimit.ErrInvalidLimit for an answer that is neither Blocked nor
// valid, and tierlimit.ErrLimitLookup for a failed lookup. It asks the
// function, and nothing else: it changes nothing.
func (l *Limiter) LimitFor(key string) (tierlimit.Limit, error) {
	if err := check.Key(key); err != nil {
		return tierlimit.Limit{}, named(err)
	}
	limit, err := l.limitOf(key)
	if err != nil {
		return tierlimit.Limit{}, named(err)
	}
	if limit.IsBlocked() {
		return limit, nil
	}
	if err := limit.Validate(); err != nil {
		return tierlimit.Limit{}, keyError(key, err)
	}
	return limit, nil
}

// blocked is the denial of every call for a key WithLimitFunc's function
// blocks (tierlimit.Blocked).
var blocked = tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}

// checkBlockedCost refuses a negative cost for a blocked key, whose
// capacity is none: any other cost is denied, not refused.
func checkBlockedCost(key string, n int64) error {
	if n < 0 {
		return keyError(key, fmt.Errorf("%w: n %d must be >= 0", tierlimit.ErrInvalidCost, n))
	}
	return nil
}

// keyError adds the package, before, and the key, after, to an error about
// key's limit or cost.
func keyError(key string, err error) error {
	return fmt.Errorf("local: %w (key %q)", err, key)
}

// AllowAll decides takes together, each key at its own limit: it takes
// every take's N only if every key holds it, and charges no key otherwise.
// Takes of one key are added up. The Result is the
// most restrictive take's: on a denial, that of the largest RetryAfter
// (after it, the same call can succeed); on an admission, that of the
// smallest Remaining. A take of a key WithLimitFunc's function blocks
// denies the whole call with the blocked Result (RetryAfter 0) and charges
// no key. ctx is accepted and ignored: no call waits.
//
// Errors wrap tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost (no takes,
// more than tierlimit.MaxTakes keys, or a key's N outside [0, its burst])
// or tierlimit.ErrInvalidLimit (a bad limit from WithLimitFunc's
// function), and no key is charged; after Close AllowAll returns
// tierlimit.ErrClosed.
func (l *Limiter) AllowAll(_ context.Context, takes ...tierlimit.Take) (tierlimit.Result, error) {
	res, err := l.allowAll(takes)
	if err != nil {
		return res, named(err)
	}
	if l.onDecision != nil {
		var n int64
		for _, t := range takes {
			n += t.N
		}
		l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Limit: res.Limit})
	}
	return res, nil
}

func (l *Limiter) allowAll(takes []tierlimit.Take) (tierlimit.Result, error) {
	merged, err := check.Takes(takes)
	if err != nil {
		return tierlimit.Result{}, fmt.Errorf("local: %w", err)
	}
	// Buckets are locked in key order, so that AllowAlls sharing keys
	// cannot each hold one the other waits for.
	slices.SortFunc(merged, func(a, b tierlimit.Take) int { return strings.Compare(a.Key, b.Key) })
	h := front.Hash(merged[0].Key)
	if !l.gate.Enter(h) {
		return tierlimit.Result{}, tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	xt := make([]xrate.Take, len(merged))
	isBlocked := false
	for i, t := range merged {
		limit, err := l.limitOf(t.Key)
		if err != nil {
			return tierlimit.Result{}, err
		}
		xt[i] = xrate.Take{Limit: limit, N: t.N}
		if limit.IsBlocked() {
			isBlocked = true
			continue
		}
		if err := xt[i].Limit.Validate(); err != nil {
			return tierlimit.Result{}, keyError(t.Key, err)
		}
		if err := xt[i].Limit.CheckCost(t.N); err != nil {
			return tierlimit.Result{}, keyError(t.Key, err)
		}
	}
	if isBlocked {
		return blocked, nil
	}
	now := l.nanos()
	for i, t := range merged {
		b, err := l.bucket(t.Key, front.Hash(t.Key), xt[i].Limit, now)
		if err != nil {
			return tierlimit.Result{}, err
		}
		xt[i].Bucket = b
	}
	res, err := xrate.DecideAll(time.Unix(0, now), xt)
	if err != nil {
		return tierlimit.Result{}, fmt.Errorf("local: %w", err)
	}
	return res, nil
}

// WaitN blocks until n events may happen for key, takes them, and returns
// the admitting Result. Waiters on one key are served in the order they
// came, and only the first asks the bucket, once per RetryAfter. WaitN
// waits on the real clock (time.Now and timers), whatever WithClock says.
//
// It returns at once an error wrapping tierlimit.ErrWaitDeadline when the
// wait would pass ctx's deadline (with the denying Result when key's own
// RetryAfter says so), or when key is blocked (WithLimitFunc's function
// answers tierlimit.Blocked, at the start or during the wait: no wait
// ends; with the blocked Result), and ctx's error when ctx ends first. Bad input is
// refused before any wait, as AllowN refuses it; after Close (waiters
// included) it returns tierlimit.ErrClosed.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := check.Key(key); err != nil {
		return tierlimit.Result{}, named(err)
	}
	if l.gate.Closed() {
		return tierlimit.Result{}, tierlimit.ErrClosed
	}
	limit, err := l.LimitFor(key)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if limit.IsBlocked() {
		err = checkBlockedCost(key, n)
	} else if err = limit.CheckCost(n); err != nil {
		err = keyError(key, err)
	}
	if err != nil {
		return tierlimit.Result{}, err
	}
	res, err := l.lines.N(ctx, key, func() (tierlimit.Result, error) { return l.AllowN(ctx, key, n) })
	return res, named(err)
}

// Settle corrects an earlier charge of key: charged events were taken and
// used really happened. charged > used gives the difference back (capped
// at the key's burst); used > charged takes the difference more, into debt
// below empty when the key lacks it, down to minus its burst at the most
// (the events happened: Settle never refuses, and tokens really used are
// not forgiven). A key in debt is denied every cost, peeks included, until
// its rate has repaid the debt: RetryAfter counts it, exactly, as does
// ResetAfter; Remaining is 0. used may exceed the burst (an upload larger
// than the bucket): what the floor cuts off is the Result's Uncharged, the
// rest is charged. It returns the key's Result after the correction, Allowed. For a key
// WithLimitFunc's function blocks, Settle changes nothing and returns the
// blocked Result (not Allowed, Limit tierlimit.Blocked). ctx is accepted
// and ignored.
//
// Errors wrap tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost (charged
// outside [0, the key's burst], or used negative) or tierlimit.ErrInvalidLimit (a bad
// limit from WithLimitFunc's function), and change nothing; after Close it
// returns tierlimit.ErrClosed.
func (l *Limiter) Settle(_ context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	res, err := l.settle(key, charged, used)
	if err != nil {
		return res, named(err)
	}
	if used == 0 && charged > 0 && !res.Limit.IsBlocked() && l.onGiveBack != nil {
		l.onGiveBack(tierlimit.GiveBack{Source: tierlimit.SourceLocal, N: charged, Limit: res.Limit})
	}
	return res, err
}

func (l *Limiter) settle(key string, charged, used int64) (tierlimit.Result, error) {
	if err := check.Key(key); err != nil {
		return tierlimit.Result{}, err
	}
	h := front.Hash(key)
	if !l.gate.Enter(h) {
		return tierlimit.Result{}, tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	limit, err := l.limitOf(key)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if limit.IsBlocked() {
		if err := checkBlockedCost(key, min(charged, used)); err != nil {
			return tierlimit.Result{}, err
		}
		return blocked, nil
	}
	now := l.nanos()
	b, err := l.bucket(key, h, limit, now)
	if err != nil {
		return tierlimit.Result{}, err
	}
	res, err := b.Settle(time.Unix(0, now), limit, charged, used)
	if err != nil {
		return tierlimit.Result{}, keyError(key, err)
	}
	return res, nil
}
