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
// client's clock instead of the Redis server's. It is tierlimit.Clock.
type Clock = tierlimit.Clock

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
	hold   time.Duration // WithLeaseLedger
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

// maxHold bounds WithLeaseLedger's hold.
const maxHold = 2 * time.Hour

// WithLeaseLedger makes a TokenBucket keep, next to each bucket, a ledger
// of the tokens leased to holders (Claim.Holder) that they may still spend,
// and refill the bucket only up to its capacity minus those tokens. The
// level and the tokens held then never add up to more than the capacity,
// so that holders spending leased tokens admit, over any interval T, at
// most capacity + rate·T, as one bucket would. The hybrid tier leases this
// way.
//
// hold is how long after a holder's last grant its tokens stay in the
// ledger: the holder must spend none of them after that (a holder's refund
// or claim ends or lowers its entry sooner). It must be between 1 ms and
// two hours. A TokenBucket with a ledger enforces one limit (no WithLimits);
// Lease, LeaseBatch and Refund then need a Holder, and AllowN admits only
// from what the ledger leaves in the bucket.
func WithLeaseLedger(hold time.Duration) Option {
	return optionFunc(func(c *config) error {
		if hold < time.Millisecond || hold > maxHold {
			return fmt.Errorf("%w: remote: lease ledger hold %v must be between 1ms and %v",
				tierlimit.ErrInvalidOption, hold, maxHold)
		}
		c.hold = hold
		return nil
	})
}
