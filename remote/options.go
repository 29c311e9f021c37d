package remote

import (
	"fmt"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
)

// DefaultPrefix begins every Redis key a limiter writes, unless WithPrefix
// says otherwise.
const DefaultPrefix = "tierlimit:"

// maxPrefixLen bounds WithPrefix so that keys stay short.
const maxPrefixLen = 64

// Clock tells the time. Pass one to WithClientClock to decide on the
// client's clock instead of the Redis server's.
type Clock interface {
	Now() time.Time
}

// Option configures a limiter of this package.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix string
	extra  []tierlimit.Limit
	clock  Clock
	obs    *tierlimit.Observer
}

// WithPrefix sets the prefix of every Redis key (default DefaultPrefix). It
// must be at most 64 bytes and hold no '{' or '}' (the library owns the
// hash tag).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if len(prefix) > maxPrefixLen || strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: remote: prefix %q must be at most %d bytes without '{' or '}'",
				tierlimit.ErrInvalidOption, prefix, maxPrefixLen)
		}
		c.prefix = prefix
		return nil
	})
}

// WithLimits adds limits enforced together with the constructor's: a request
// is admitted only if every limit admits it, and then charged to all of them,
// in one round trip. Result.Limit names the most restrictive one.
func WithLimits(limits ...tierlimit.Limit) Option {
	return optionFunc(func(c *config) error {
		c.extra = append(c.extra, limits...)
		return nil
	})
}

// WithClientClock makes the scripts use clock instead of the Redis server's
// TIME. Use it only for Redis-compatible servers without TIME, or in tests:
// with it, clock skew between app servers changes decisions.
func WithClientClock(clock Clock) Option {
	return optionFunc(func(c *config) error {
		if clock == nil {
			return fmt.Errorf("%w: remote: nil clock", tierlimit.ErrInvalidOption)
		}
		c.clock = clock
		return nil
	})
}

// WithObserver reports to o each decision of Allow and AllowN (Source
// remote) and each round trip to Redis, by Op: "allow" for Allow and AllowN,
// "reset" for Reset, "claim" for Lease and LeaseBatch, "refund" for Refund
// (see tierlimit.Observer). Lease, LeaseBatch and Refund report no decision:
// the hybrid tier that calls them decides. Without an observer nothing is
// measured.
func WithObserver(o *tierlimit.Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("%w: remote: nil observer", tierlimit.ErrInvalidOption)
		}
		c.obs = o
		return nil
	})
}
