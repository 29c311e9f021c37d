package tierlimit

import "time"

// Observer receives what a limiter does, for metrics and logs. Each field is
// optional: a nil func is not called. The funcs are called synchronously on
// the deciding goroutine (Decision) or on the goroutine that made the Redis
// call (RedisCall, Breaker), never under a limiter's lock, so they must be
// fast and safe for concurrent use. An Observer must not be changed after it
// is passed to a limiter.
//
// Keys are not reported: they are unbounded in number and may be personal
// data. Observer follows the pattern of net/http/httptrace: new fields may
// be added, so set fields by name, and give a limiter several Observers
// with Observers, which fans out every field, rather than with a func of
// your own that calls theirs, which would drop the fields added later.
type Observer struct {
	// Decision is called once per decision that returned no error.
	Decision func(Decision)
	// RedisCall is called once per script call or pipeline to Redis.
	RedisCall func(RedisCall)
	// Breaker is called when a limiter's circuit breaker changes state.
	Breaker func(BreakerChange)
	// Eviction is called with what the Redis server says about evicting
	// keys: at New, and whenever a later reading differs in risk or
	// finds more keys evicted while risky.
	Eviction func(EvictionRisk)
	// GiveBack is called once per Settle that gives a whole charge back
	// (used 0), without error: an admission Decision reported Allowed
	// that did not happen after all, such as httplimit's give-back of
	// what earlier limiters charged a request a later one refused.
	GiveBack func(GiveBack)
	// Permit is called once per acquisition of a concurrency limiter
	// that returned no error (each TryAcquire, each Acquire that got a
	// permit) and once per Acquire that gave up waiting (ctx done).
	Permit func(PermitDecision)
}

// PermitDecision describes one acquisition of a concurrency limiter
// (Observer.Permit).
type PermitDecision struct {
	Acquired bool
	// Source is SourceLocal for a permit given in process (local, or
	// hybrid's block), SourceRemote for one Redis decided (remote, or a
	// hybrid lease just claimed), SourceFallback for one from hybrid's
	// share while Redis is down.
	Source Source
	Waited time.Duration // how long Acquire waited; 0 for TryAcquire and a permit free at once
}

// GiveBack describes a charge given back whole (Observer.GiveBack).
type GiveBack struct {
	Source Source // the tier that gave it back
	N      int64  // the charge given back
	Limit  Limit  // the key's limit (Decision.Limit's label for per-limit metrics)
}

// Decision describes one decision.
type Decision struct {
	Allowed bool
	Source  Source
	N       int64         // the cost asked for (AllowAtMost: what it granted, or n when it granted none)
	Latency time.Duration // from the call to the decision; 0 for hybrid's in-process decisions (a lease, a known block)
	Limit   Limit         // the limit that decided (Result.Limit): a bounded label for per-limit metrics
}

// RedisCall describes one round trip to Redis.
type RedisCall struct {
	Op      string        // what the call did, e.g. "allow", "claim", "refund", "heartbeat"
	Latency time.Duration // round-trip time; the budget, for a call reported when it ran out of it
	Err     error         // nil on success; wraps context.DeadlineExceeded for a call over its budget
}

// BreakerChange describes a transition of a circuit breaker.
type BreakerChange struct {
	From, To BreakerState
}

// BreakerState is the state of a limiter's circuit breaker in front of
// Redis.
type BreakerState uint8

// The breaker states. While Open, no decision waits on Redis; HalfOpen lets
// probes through to find out whether Redis answers again.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

var breakerNames = [...]string{"closed", "half-open", "open"}

// String returns the state's lower-case name, e.g. "half-open".
func (s BreakerState) String() string {
	if int(s) < len(breakerNames) {
		return breakerNames[s]
	}
	return "unknown"
}
