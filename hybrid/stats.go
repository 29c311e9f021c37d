package hybrid

import (
	"sync/atomic"

	"github.com/tierlimit/tierlimit"
)

// Stats are a Limiter's counters since New. The token ledger balances:
// Leased = Spent + Refunded + Lost + Held.
type Stats struct {
	// Decisions by source.
	Local, Blocked, Remote, Fallback int64
	Allowed, Denied                  int64

	RedisCalls  int64 // script calls: claims, refund batches, heartbeats
	RedisErrors int64 // calls that failed or ran out of budget (counted when it ran out)

	Leased   int64 // tokens claimed from Redis
	Spent    int64 // leased tokens that admitted a request
	Refunded int64 // tokens given back to Redis (or dropped by Reset, which refills the key)
	Lost     int64 // tokens that could not be refunded (Redis unreachable); never spent
	Held     int64 // tokens in leases right now

	// Degraded mode.
	Breaker       tierlimit.BreakerState // the circuit breaker in front of Redis, now
	BreakerOpens  int64                  // times it opened
	Instances     int64                  // live instances of the fleet last seen (1 before the first heartbeat)
	FallbackLimit tierlimit.Limit        // what each key is held to while Redis is unreachable (mode FailFallback)

	// Eviction is what the Redis server said about evicting keys when
	// last read: at New, then about once a minute while leases are
	// claimed.
	Eviction tierlimit.EvictionRisk
}

// counters are the live counters behind Stats, besides the decision
// counters (Limiter.decided). Spent is derived: leased - refunded - lost -
// held, where held is summed over the leases.
type counters struct {
	redisCalls, redisErrors atomic.Int64
	leased, refunded, lost  atomic.Int64
}
