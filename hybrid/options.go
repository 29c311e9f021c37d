package hybrid

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/store"
)

// Defaults of the options.
const (
	DefaultMaxKeys        = 100_000
	DefaultLeaseTTL       = 2 * time.Second
	DefaultRefillInterval = 50 * time.Millisecond
	DefaultCallBudget     = 25 * time.Millisecond
	// DefaultBreakerThreshold is the number of consecutive failed Redis
	// calls that open the circuit breaker.
	DefaultBreakerThreshold = 3
	// DefaultProbeInterval is how long the breaker stays open before it
	// lets a probe through to Redis.
	DefaultProbeInterval = 500 * time.Millisecond
	// DefaultHeartbeat is how often an instance tells Redis it is alive.
	// An instance silent for three heartbeats no longer counts.
	DefaultHeartbeat = time.Second
	// DefaultLeaseShare caps a lease at Burst/DefaultLeaseShare tokens, so
	// that few tokens sit stranded on one instance.
	DefaultLeaseShare = 10
)

// Clock tells the time. WithClock injects one; tests step it. It is
// tierlimit.Clock.
type Clock = tierlimit.Clock

// Option configures a Limiter.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	minLease, maxLease int64 // 0: derived from the limit
	leaseTTL           time.Duration
	refillInterval     time.Duration
	callBudget         time.Duration
	maxKeys            int64
	clock              Clock
	fallback           *tierlimit.Limit
	limitFunc          tierlimit.LimitFunc
	limitLookup        tierlimit.LimitLookup
	lookupOpen         bool         // WithLookupFailOpen
	lookup             check.Lookup // New's, of the three above
	extra              []tierlimit.Limit
	prefix             string
	failureMode        FailureMode
	breakerThreshold   uint32
	probeInterval      time.Duration
	heartbeat          time.Duration
	observer           *tierlimit.Observer
	logger             *slog.Logger // nil: slog.Default()
}

func defaults() config {
	return config{
		leaseTTL:         DefaultLeaseTTL,
		refillInterval:   DefaultRefillInterval,
		callBudget:       DefaultCallBudget,
		maxKeys:          DefaultMaxKeys,
		clock:            tierlimit.SystemClock{},
		prefix:           store.DefaultPrefix,
		breakerThreshold: DefaultBreakerThreshold,
		probeInterval:    DefaultProbeInterval,
		heartbeat:        DefaultHeartbeat,
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("hybrid: %w: "+format, append([]any{tierlimit.ErrInvalidOption}, args...)...)
}

// WithLimits adds limits that every key is held to as well, as
// remote.WithLimits does (e.g. 1 per 5 s AND 5 per hour): a lease is
// claimed from all of the key's buckets at once, all or nothing, so that
// the fleet admits what every limit allows. Leases are bounded by the
// smallest Burst, and while Redis is unreachable a key is held to its
// share of the tightest limit (the lowest rate, with the smallest burst).
// Every limit's bucket keeps its lease ledger, which records each grant:
// over any interval the fleet admits at most what each limit's one bucket
// would (docs/design.md, G1).
func WithLimits(limits ...tierlimit.Limit) Option {
	return optionFunc(func(c *config) error {
		for _, lim := range limits {
			if err := lim.Validate(); err != nil {
				return fmt.Errorf("hybrid: limits: %w", err)
			}
		}
		c.extra = append(c.extra, limits...)
		return nil
	})
}

// WithLimitFunc gives keys limits of their own: f(key) is a key's limit,
// and New's limit the default (for the keys f answers the zero Limit).
// One Limiter, with its one cache, goroutines and heartbeat, serves keys
// of any number of limits.
//
// f is asked at most once per key per lease TTL, on every path (AllowN,
// AllowAll, WaitN, Settle, and the background refills of hot keys): the
// key's entry holds the answer meanwhile, so a slow f costs only the calls
// that ask it. A changed answer (a plan upgrade) applies within one lease
// TTL, on every instance, and the key keeps its state in Redis, its tokens
// capped at the new Burst. Lease bounds (WithLeaseBounds) are capped at
// each limit's Burst; the fallback holds a key to its own limit's share,
// unless WithFallback sets one for every key. A limit f returns that
// is not valid makes the call that asked return an error wrapping
// tierlimit.ErrInvalidLimit. f runs under no lock of the limiter: a panic
// in f reaches the caller whose call asked, and the limiter stays usable;
// a panic or an invalid answer in a background refill stops the key's
// refills until a call asks again.
func WithLimitFunc(f tierlimit.LimitFunc) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil limit func")
		}
		c.limitFunc = f
		return nil
	})
}

// WithLimitLookup gives keys limits of their own as WithLimitFunc does,
// from f, which may fail (see tierlimit.LimitLookup), asked as often as
// WithLimitFunc's function. A call whose key's lookup fails returns an
// error wrapping tierlimit.ErrLimitLookup and f's error: the key is not
// decided under the default, unless WithLookupFailOpen says so, and the
// failure is not remembered (the key's next call asks again). A failure
// in a background refill stops the key's refills until a call asks again.
// It may not be given with WithLimitFunc.
func WithLimitLookup(f tierlimit.LimitLookup) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("nil limit lookup")
		}
		c.limitLookup = f
		return nil
	})
}

// WithLookupFailOpen decides a key whose WithLimitLookup lookup fails
// under New's limit, as if the lookup had answered the zero Limit (an
// answer the key then keeps for a lease TTL, as any), instead of returning
// an error (the default: fail closed). It needs WithLimitLookup.
func WithLookupFailOpen() Option {
	return optionFunc(func(c *config) error {
		c.lookupOpen = true
		return nil
	})
}

// WithLeaseBounds bounds the size of a lease: at least lo tokens (default 1)
// and at most hi (default Burst/DefaultLeaseShare, at least 1). hi = 1 is
// exact mode: every claim takes exactly what the call asks, as a remote
// limiter would. The bounds must satisfy 1 <= lo <= hi <= Burst.
func WithLeaseBounds(lo, hi int64) Option {
	return optionFunc(func(c *config) error {
		if lo < 1 || hi < lo {
			return invalid("lease bounds [%d, %d] need 1 <= lo <= hi", lo, hi)
		}
		c.minLease, c.maxLease = lo, hi
		return nil
	})
}

// WithLeaseTTL sets how long unspent leased tokens stay on this instance
// before they are refunded to Redis (default DefaultLeaseTTL; 10 ms to 1 h).
// Shorter returns stranded tokens sooner, at the cost of more refunds.
func WithLeaseTTL(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 10*time.Millisecond || d > time.Hour {
			return invalid("lease TTL %v must be between 10ms and 1h", d)
		}
		c.leaseTTL = d
		return nil
	})
}

// WithRefillInterval sets how much demand a lease is sized for: about this
// long of the key's local demand (default DefaultRefillInterval; 1 ms to 10 s).
// Longer means fewer Redis calls and more tokens held locally.
func WithRefillInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond || d > 10*time.Second {
			return invalid("refill interval %v must be between 1ms and 10s", d)
		}
		c.refillInterval = d
		return nil
	})
}

// WithCallBudget bounds how long one decision may wait on Redis (default
// DefaultCallBudget; 1 ms to 10 s). A call that takes longer is abandoned
// and the decision falls back. The Redis client must honour context
// deadlines (go-redis: Options.ContextTimeoutEnabled) for the budget to cut
// a call short.
func WithCallBudget(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond || d > 10*time.Second {
			return invalid("call budget %v must be between 1ms and 10s", d)
		}
		c.callBudget = d
		return nil
	})
}

// maxMaxKeys bounds WithMaxKeys: ristretto allocates its admission
// counters up front, about 48 bytes per key, whether or not the keys come.
const maxMaxKeys = 1 << 24

// WithMaxKeys bounds the keys held in process (default DefaultMaxKeys),
// from 1 to 2^24 (16,777,216). Each key held costs a few hundred bytes, and
// New allocates about 96 bytes per key of the bound up front (ristretto's
// admission counters, for the leases and for the fallback), and a front
// table of 64 bytes per key, at most 1 MiB: memory is bounded whatever
// number of distinct keys arrives. The live heap stays below n × 1 KiB +
// 8 MiB (keys up to 64 bytes).
func WithMaxKeys(n int64) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > maxMaxKeys {
			return invalid("max keys %d must be between 1 and %d", n, maxMaxKeys)
		}
		c.maxKeys = n
		return nil
	})
}

// WithPrefix sets the Redis key prefix (default "tierlimit:", as
// remote.DefaultPrefix), as remote.WithPrefix does for the token bucket
// leases are claimed from: at most 64 bytes, no '{' or '}'.
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if err := store.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("hybrid: %w", err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithClock sets the clock of local decisions (default time.Now). Redis
// keeps its own clock for the bucket.
func WithClock(clock Clock) Option {
	return optionFunc(func(c *config) error {
		if clock == nil {
			return invalid("nil clock")
		}
		c.clock = clock
		return nil
	})
}

// WithFallback sets the limit each key is held to, in this process, while
// Redis cannot be reached (mode FailFallback). By default it is this
// instance's share of the limit: the limit divided by the number of live
// instances, which the instances publish to Redis with a heartbeat (see
// WithHeartbeat); during an outage the last count known is used. Set it
// when the fleet's size is known better than the heartbeat can tell, e.g.
// for an instance that starts while Redis is down and so counts itself
// alone.
func WithFallback(limit tierlimit.Limit) Option {
	return optionFunc(func(c *config) error {
		if err := limit.Validate(); err != nil {
			return fmt.Errorf("hybrid: fallback: %w", err)
		}
		c.fallback = &limit
		return nil
	})
}

// FailureMode says how a Limiter decides while Redis cannot be reached. In
// every mode, tokens already leased are spent first: they were debited in
// Redis.
type FailureMode uint8

// The failure modes.
const (
	// FailFallback decides with an in-process limiter per key at this
	// instance's share of the limit (see WithFallback): the fleet stays
	// near the limit. The default, and the right choice for most limits.
	FailFallback FailureMode = iota
	// FailOpen allows every call. Choose it when being limited by an
	// outage costs more than the load the limit protects from, e.g. a
	// limit that only smooths traffic to a backend that can take bursts.
	FailOpen
	// FailClosed denies every call, with RetryAfter set to the probe
	// interval. Choose it when a call admitted over the limit costs more
	// than one refused, e.g. limits on spending, sending or login attempts.
	FailClosed
)

var failureModeNames = [...]string{"fallback", "open", "closed"}

// String returns the mode's name: "fallback", "open" or "closed".
func (m FailureMode) String() string {
	if int(m) < len(failureModeNames) {
		return failureModeNames[m]
	}
	return "unknown"
}

// WithFailureMode sets how calls are decided while Redis cannot be reached
// (default FailFallback). Decisions then carry Source
// tierlimit.SourceFallback, whatever the mode.
func WithFailureMode(m FailureMode) Option {
	return optionFunc(func(c *config) error {
		if m > FailClosed {
			return invalid("unknown failure mode %d", m)
		}
		c.failureMode = m
		return nil
	})
}

// WithBreakerThreshold sets how many consecutive failed Redis calls (errors
// or calls over the budget) open the circuit breaker (default
// DefaultBreakerThreshold; 1 to 1000). While it is open no decision waits on
// Redis at all.
func WithBreakerThreshold(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > 1000 {
			return invalid("breaker threshold %d must be between 1 and 1000", n)
		}
		c.breakerThreshold = uint32(n)
		return nil
	})
}

// WithProbeInterval sets how long the circuit breaker stays open before one
// call probes Redis again (default DefaultProbeInterval; 10 ms to 1 min).
// Leasing resumes within one probe interval of Redis answering.
func WithProbeInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 10*time.Millisecond || d > time.Minute {
			return invalid("probe interval %v must be between 10ms and 1m", d)
		}
		c.probeInterval = d
		return nil
	})
}

// WithHeartbeat sets how often this instance records itself in Redis as a
// live member of the fleet (default DefaultHeartbeat; 10 ms to 1 min). The
// live count sets the default fallback share. Instances of one fleet share
// the key prefix and the limit.
func WithHeartbeat(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 10*time.Millisecond || d > time.Minute {
			return invalid("heartbeat %v must be between 10ms and 1m", d)
		}
		c.heartbeat = d
		return nil
	})
}

// WithObserver reports decisions, Redis calls and breaker changes to o (see
// tierlimit.Observer). With no observer, nothing is measured.
func WithObserver(o *tierlimit.Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return invalid("nil observer")
		}
		c.observer = o
		return nil
	})
}

// WithLogger sets the logger the limiter logs in (default: slog.Default(),
// read when a line is logged): a warning when Redis stops answering (the
// circuit breaker opens) and a line when it answers again (it closes),
// once per outage, the probes between at debug level; and a warning of a
// Redis server that may evict its keys, when the risk appears or becomes
// unknown, not on every reading. Given a logger, the limiter logs nothing
// to slog.Default(). go-redis logs on its own (redis.SetLogger).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	})
}
