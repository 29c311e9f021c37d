package remote

import (
	"fmt"
	"log/slog"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// DefaultPrefix begins every Redis key a limiter writes, unless WithPrefix
// says otherwise.
const DefaultPrefix = store.DefaultPrefix

// NewTimeout is the longest a constructor waits for Redis (see NewGCRA).
const NewTimeout = store.NewTimeout

// Clock tells the time. Pass one to WithClientClock to decide on the
// client's clock instead of the Redis server's. It is tierlimit.Clock.
type Clock = tierlimit.Clock

// Option configures a limiter of this package.
type Option interface {
	apply(*store.Config) error
}

type optionFunc func(*store.Config) error

func (f optionFunc) apply(c *store.Config) error { return f(c) }

// WithPrefix sets the prefix of every Redis key (default DefaultPrefix). It
// must be at most 64 bytes and hold no '{' or '}' (the library owns the
// hash tag).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *store.Config) error {
		if err := store.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("remote: %w", err)
		}
		c.Prefix = prefix
		return nil
	})
}

// WithLimits adds limits enforced together with the constructor's: a request
// is admitted only if every limit admits it, and then charged to all of them,
// in one round trip. Result.Limit names the most restrictive one.
func WithLimits(limits ...tierlimit.Limit) Option {
	return optionFunc(func(c *store.Config) error {
		c.Extra = append(c.Extra, limits...)
		return nil
	})
}

// WithClientClock makes the scripts use clock instead of the Redis server's
// TIME. Use it only for Redis-compatible servers without TIME, or in tests:
// with it, clock skew between app servers changes decisions.
func WithClientClock(clock Clock) Option {
	return optionFunc(func(c *store.Config) error {
		if clock == nil {
			return fmt.Errorf("remote: %w: nil clock", tierlimit.ErrInvalidOption)
		}
		c.Clock = clock
		return nil
	})
}

// WithLimitFunc gives each key its own limit: f(key), asked on every
// decision, in place of the constructor's limit, which stays the default
// (f's zero Limit means it). Limits given with WithLimits apply to every
// key besides. A key keeps its state when f's answer for it changes (a
// plan upgrade): its state records the limit it was written under, and is
// converted to the new one on the key's next call, refilled under the old
// limit up to then: a token bucket keeps its tokens up to the new Burst,
// as x/time/rate's SetLimit does, GCRA the same, windows keep their
// counts up to the new Rate, the sliding log keeps its log (judged by the
// new Rate and Period). A bad answer (Limit.Validate, or the algorithm's
// own rules) makes the call return an error wrapping
// tierlimit.ErrInvalidLimit. tierlimit.Blocked blocks the key: every call
// is denied without a call to Redis and without charging it, with
// Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked} and
// RetryAfter 0 (no promise). f must be fast, safe for concurrent use, and
// must not call the limiter.
func WithLimitFunc(f tierlimit.LimitFunc) Option {
	return optionFunc(func(c *store.Config) error {
		if f == nil {
			return fmt.Errorf("remote: %w: nil LimitFunc", tierlimit.ErrInvalidOption)
		}
		c.LimitFunc = f
		return nil
	})
}

// WithLimitLookup gives each key its own limit as WithLimitFunc does, from
// f, which may fail (see tierlimit.LimitLookup), asked on every decision.
// A call whose key's lookup fails returns an error wrapping
// tierlimit.ErrLimitLookup and f's error, before any call to Redis: the
// key is neither charged nor decided under the default, unless
// WithLookupFailOpen says so. It may not be given with WithLimitFunc.
func WithLimitLookup(f tierlimit.LimitLookup) Option {
	return optionFunc(func(c *store.Config) error {
		if f == nil {
			return fmt.Errorf("remote: %w: nil LimitLookup", tierlimit.ErrInvalidOption)
		}
		c.LimitLookup = f
		return nil
	})
}

// WithLookupFailOpen decides a key whose WithLimitLookup lookup fails
// under the constructor's limit, as if the lookup had answered the zero
// Limit, instead of returning an error (the default: fail closed). It
// needs WithLimitLookup.
func WithLookupFailOpen() Option {
	return optionFunc(func(c *store.Config) error {
		c.LookupFailOpen = true
		return nil
	})
}

// WithObserver reports to o each decision of Allow, AllowN and AllowAll
// (Source remote), each round trip to Redis, by Op ("allow" for Allow,
// AllowN and each call of AllowAll, "settle" for Settle and AllowAll's
// give-backs, "reset" for Reset), each Settle that gives a whole charge
// back (used 0: an admission undone, such as httplimit's give-back of a
// refused request's charge), and each change in the server's eviction
// settings (see tierlimit.Observer). Without an observer nothing is
// measured.
func WithObserver(o *tierlimit.Observer) Option {
	return optionFunc(func(c *store.Config) error {
		if o == nil {
			return fmt.Errorf("remote: %w: nil observer", tierlimit.ErrInvalidOption)
		}
		c.Observer = o
		return nil
	})
}

// WithLogger sets the logger the limiter warns in, of a Redis server that
// may evict its keys (default: slog.Default(), read when a line is
// logged). A warning is logged when the risk appears or becomes unknown,
// not on every reading.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *store.Config) error {
		if l == nil {
			return fmt.Errorf("remote: %w: nil logger", tierlimit.ErrInvalidOption)
		}
		c.Logger = l
		return nil
	})
}
