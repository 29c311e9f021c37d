package hybrid

// Stats: the counters, and the decisions' tallies.

import (
	"slices"
	"strings"
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
	Lost     int64 // tokens that could not be refunded (Redis unreachable); never spent. A refund whose call got no reply counts here until Redis says it ran (within 30 s)
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

	// Limits are the decisions by the limit of their key (WithLimitFunc):
	// the default's first, then each other limit's, by name, for the
	// first 1,024 limits seen; decisions under later ones count with the
	// default's. Without WithLimitFunc, the default's only.
	Limits []LimitStats
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
	s.Limits = l.limitStats(s.Allowed, s.Denied)
	return s
}

// decisionStripes is the number of stripes of the decision counters.
const decisionStripes = 16

func (l *limiter) count(s tierlimit.Source) int64 {
	var n int64
	for i := range l.decided {
		n += l.decided[i].n[s][0].Load() + l.decided[i].n[s][1].Load()
	}
	return n
}

// record counts a decision under policy p in stripe (an entry's, or 0 off
// the hot path).
func (l *limiter) record(p *policy, res tierlimit.Result, stripe uint8) tierlimit.Result {
	l.tally(p, res.Source, res.Allowed, stripe)
	return res
}

// countLocal counts an allowed local decision on e's line, which the
// spend's CAS already owns (BenchmarkHotKeyParallel: a counter shared by
// the cores spending a hot key costs a line moved between them per
// decision). Stats adds the entries' counts up (harvest); an entry the
// table no longer holds is retired first, and a spend that finds it
// retired adds its count at once: with the atomics' order, every count is
// added exactly once, by retire or by the spend.
func (l *limiter) countLocal(e *entry) {
	e.local.Add(1)
	if e.retired.Load() {
		l.harvest(e)
	}
}

// harvest adds e's uncounted local decisions to the limiter's count, and
// to its policy's.
func (l *limiter) harvest(e *entry) {
	if n := e.local.Swap(0); n > 0 {
		l.decided[e.stripe%decisionStripes].n[tierlimit.SourceLocal][1].Add(n)
		if c := e.policy().counts; c != nil {
			c[e.stripe%decisionStripes].n[1].Add(n)
		}
	}
}

// tally counts a decision from src under policy p in stripe. The hot path
// calls it rather than record, which copies the Result in and out
// (BenchmarkAllowLease).
func (l *limiter) tally(p *policy, src tierlimit.Source, allowed bool, stripe uint8) {
	i := 0
	if allowed {
		i = 1
	}
	l.decided[stripe%decisionStripes].n[src][i].Add(1)
	if p.counts != nil {
		p.counts[stripe%decisionStripes].n[i].Add(1)
	}
}

// policyCounts are a limit's decisions (WithLimitFunc), denied and
// allowed, striped as the limiter's are.
type policyCounts [decisionStripes]struct {
	n [2]atomic.Int64
	_ [48]byte
}

// LimitStats are the decisions made under one limit (Stats.Limits).
type LimitStats struct {
	Limit           tierlimit.Limit
	Allowed, Denied int64
}

// limitStats returns the decisions by limit, the default's first, given
// the totals: the default's are what the other limits leave.
func (l *limiter) limitStats(allowed, denied int64) []LimitStats {
	if !l.cfg.lookup.Set() {
		return []LimitStats{{Limit: l.limit, Allowed: allowed, Denied: denied}}
	}
	var pols []*policy
	l.pols.Each(func(_ tierlimit.Limit, p *policy) { pols = append(pols, p) })
	out := make([]LimitStats, 1, 1+len(pols))
	for _, p := range pols {
		ls := LimitStats{Limit: p.limit}
		for i := range p.counts {
			ls.Denied += p.counts[i].n[0].Load()
			ls.Allowed += p.counts[i].n[1].Load()
		}
		allowed -= ls.Allowed
		denied -= ls.Denied
		out = append(out, ls)
	}
	slices.SortFunc(out[1:], func(a, b LimitStats) int { return strings.Compare(a.Limit.String(), b.Limit.String()) })
	out[0] = LimitStats{Limit: l.limit, Allowed: max(0, allowed), Denied: max(0, denied)}
	return out
}
