package remote

import (
	"fmt"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// DefaultPrefix begins every Redis key a limiter writes, unless WithPrefix
// says otherwise.
const DefaultPrefix = store.DefaultPrefix

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
			return fmt.Errorf("%w: remote: nil clock", tierlimit.ErrInvalidOption)
		}
		c.Clock = clock
		return nil
	})
}

// WithObserver reports to o each decision of Allow and AllowN (Source
// remote), each round trip to Redis, by Op ("allow" for Allow and AllowN,
// "reset" for Reset), and each change in the server's eviction settings
// (see tierlimit.Observer). Without an observer nothing is measured.
func WithObserver(o *tierlimit.Observer) Option {
	return optionFunc(func(c *store.Config) error {
		if o == nil {
			return fmt.Errorf("%w: remote: nil observer", tierlimit.ErrInvalidOption)
		}
		c.Observer = o
		return nil
	})
}
