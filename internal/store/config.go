package store

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
)

// DefaultPrefix begins every Redis key unless Config.Prefix says otherwise.
const DefaultPrefix = "tierlimit:"

// maxPrefixLen bounds Config.Prefix so that keys stay short.
const maxPrefixLen = 64

// maxHold bounds Config.Hold.
const maxHold = 2 * time.Hour

// Config is what New needs beyond the algorithm and the limit. The zero
// value uses DefaultPrefix and the server's clock, with no observer and no
// ledger.
type Config struct {
	Prefix   string            // "" for DefaultPrefix; see CheckPrefix
	Extra    []tierlimit.Limit // limits enforced together with New's
	Clock    tierlimit.Clock   // nil: the server's TIME
	Observer *tierlimit.Observer
	Logger   *slog.Logger // nil: slog.Default()

	// LimitFunc, if not nil, gives each key its own limit in place of
	// New's, per decision (AllowN, AllowAll, Settle); its zero Limit means
	// New's. The extras apply to every key.
	LimitFunc tierlimit.LimitFunc
	// LimitLookup is LimitFunc's alternative that may fail (not both):
	// a failure is an error wrapping tierlimit.ErrLimitLookup, or with
	// LookupFailOpen the default.
	LimitLookup    tierlimit.LimitLookup
	LookupFailOpen bool

	// Hold, if not zero, gives a TokenBucket a ledger of the tokens leased
	// to holders (Claim.Holder), kept Hold after a holder's last grant
	// (Lease, LeaseBatch and Refund need one):
	// the bucket refills only up to its capacity minus what they hold, so
	// holders spending leased tokens admit what one bucket would. With
	// Extra, every limit's bucket keeps its ledger, and a grant is
	// recorded in each. Between 1 ms and two hours. Claims and refunds under a
	// Claim.Limit or Refund.Limit other than the default are supported:
	// a bucket written under another limit is refilled under it (to its
	// capacity less what the ledger holds) and keeps its tokens, capped at
	// the new capacity. AllowAll and Settle are not (tierlimit.ErrInvalidOption).
	Hold time.Duration
}

// CheckPrefix reports whether prefix may begin Redis keys: at most
// 64 bytes, no '{' or '}' (the library owns the hash tag). The
// error wraps tierlimit.ErrInvalidOption.
func CheckPrefix(prefix string) error {
	if len(prefix) > maxPrefixLen || strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("%w: prefix %q must be at most %d bytes without '{' or '}'",
			tierlimit.ErrInvalidOption, prefix, maxPrefixLen)
	}
	return nil
}

// checkHold reports whether hold is a valid Config.Hold.
func checkHold(hold time.Duration) error {
	if hold < time.Millisecond || hold > maxHold {
		return fmt.Errorf("%w: lease ledger hold %v must be between 1ms and %v",
			tierlimit.ErrInvalidOption, hold, maxHold)
	}
	return nil
}

func (c Config) check(alg *Algorithm) error {
	if err := CheckPrefix(c.Prefix); err != nil {
		return err
	}
	if c.Hold != 0 {
		if err := checkHold(c.Hold); err != nil {
			return err
		}
		if alg != TokenBucket {
			return fmt.Errorf("%w: a lease ledger is for a token bucket", tierlimit.ErrInvalidOption)
		}
	}
	return nil
}
