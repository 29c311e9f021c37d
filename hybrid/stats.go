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
	ChargedBack   int64                  // tokens the fallback admitted and Redis was charged for when it returned (also in Leased and Spent)

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
	chargedBack             atomic.Int64
}

// Stats returns the counters. The ledger is read without stopping
// decisions, so under load its parts may be a few tokens apart.
func (l *Limiter) Stats() Stats {
	l.keys.each(l.harvest)
	var s Stats
	s.Local = l.count(tierlimit.SourceLocal)
	s.Blocked = l.count(tierlimit.SourceBlocked)
	s.Remote = l.count(tierlimit.SourceRemote)
	s.Fallback = l.count(tierlimit.SourceFallback)
	for i := range l.decided {
		for src := range l.decided[i].n {
			s.Denied += l.decided[i].n[src][0].Load()
			s.Allowed += l.decided[i].n[src][1].Load()
		}
	}
	s.RedisCalls = l.stats.redisCalls.Load()
	s.RedisErrors = l.stats.redisErrors.Load()
	s.Refunded = l.stats.refunded.Load()
	s.Lost = l.stats.lost.Load()
	s.Held = l.heldTokens()
	s.Leased = l.stats.leased.Load()
	s.Spent = s.Leased - s.Refunded - s.Lost - s.Held
	s.Breaker = l.brk.current()
	s.BreakerOpens = l.brk.opens.Load()
	s.Instances = l.instances.Load()
	s.FallbackLimit = *l.share.Load()
	s.ChargedBack = l.stats.chargedBack.Load()
	s.Eviction = l.bucket.Eviction()
	return s
}

// decisionStripes is the number of stripes of the decision counters.
const decisionStripes = 16

func (l *Limiter) count(s tierlimit.Source) int64 {
	var n int64
	for i := range l.decided {
		n += l.decided[i].n[s][0].Load() + l.decided[i].n[s][1].Load()
	}
	return n
}

// record counts a decision in stripe (an entry's, or 0 off the hot path).
func (l *Limiter) record(res tierlimit.Result, stripe uint8) tierlimit.Result {
	l.tally(res.Source, res.Allowed, stripe)
	return res
}

// countLocal counts an allowed local decision on e's line, which the
// spend's CAS already owns (BenchmarkHotKeyParallel: a counter shared by
// the cores spending a hot key costs a line moved between them per
// decision). Stats adds the entries' counts up (harvest); an entry the
// table no longer holds is retired first, and a spend that finds it
// retired adds its count at once: with the atomics' order, every count is
// added exactly once, by retire or by the spend.
func (l *Limiter) countLocal(e *entry) {
	e.local.Add(1)
	if e.retired.Load() {
		l.harvest(e)
	}
}

// harvest adds e's uncounted local decisions to the limiter's count.
func (l *Limiter) harvest(e *entry) {
	if n := e.local.Swap(0); n > 0 {
		l.decided[e.stripe%decisionStripes].n[tierlimit.SourceLocal][1].Add(n)
	}
}

// retire harvests e for the last time: the table no longer holds it.
func (l *Limiter) retire(e *entry) {
	e.retired.Store(true)
	l.harvest(e)
}

// forget stops following e if the table may (see table.forget), and
// retires it then.
func (l *Limiter) forget(e *entry) {
	if l.keys.forget(e) {
		l.retire(e)
	}
}

// tally counts a decision from src in stripe. The hot path calls it rather
// than record, which copies the Result in and out (BenchmarkAllowLease).
func (l *Limiter) tally(src tierlimit.Source, allowed bool, stripe uint8) {
	i := 0
	if allowed {
		i = 1
	}
	l.decided[stripe%decisionStripes].n[src][i].Add(1)
}
