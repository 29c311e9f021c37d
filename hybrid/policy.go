package hybrid

// Per-key limits (WithLimitFunc): each entry follows its key's policy.

import (
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// policy is what a Limiter derives from one limit: its capacity and its
// lease bounds. Policies are shared, never changed: an entry points to its
// key's.
type policy struct {
	limit              tierlimit.Limit
	capacity           int64
	minLease, maxLease int64
	own                tierlimit.Limit // limit, for a key's own; zero for the default (store's Claim.Limit)
	counts             *policyCounts   // decisions under a key's own limit (Stats.Limits); nil for the default's
	base               tierlimit.Limit // what the fallback shares: limit, or with WithLimits the tightest
	one, full          time.Duration   // limit.RefillTime of 1 and of capacity: a saturated key's denial
}

// refillTime is p.limit.RefillTime(n), without a 128-bit division in the
// cases a denial of a saturated key asks for.
func (p *policy) refillTime(n int64) time.Duration {
	switch n {
	case 1:
		return p.one
	case p.capacity:
		return p.full
	}
	return p.limit.RefillTime(n)
}

// slower reports whether a's rate is below b's: a.Rate/a.Period <
// b.Rate/b.Period, compared in 128 bits.
func slower(a, b tierlimit.Limit) bool {
	ah, al := bits.Mul64(uint64(a.Rate), uint64(b.Period))
	bh, bl := bits.Mul64(uint64(b.Rate), uint64(a.Period))
	return ah < bh || ah == bh && al < bl
}

// newPolicy returns limit's policy under cfg's lease bounds: the
// configured bounds (hi capped at the capacity), or 1 to
// Burst/DefaultLeaseShare.
func newPolicy(limit tierlimit.Limit, cfg *config) *policy {
	p := &policy{limit: limit, capacity: limit.Capacity(), minLease: cfg.minLease, maxLease: cfg.maxLease, base: limit}
	for _, x := range cfg.extra {
		p.capacity = min(p.capacity, x.Capacity())
		if slower(x, p.base) {
			p.base = x
		}
	}
	if len(cfg.extra) > 0 {
		p.base.Burst = p.capacity
	}
	if p.maxLease == 0 {
		p.minLease, p.maxLease = 1, max(1, p.capacity/DefaultLeaseShare)
	}
	p.maxLease = min(p.maxLease, p.capacity)
	p.minLease = min(p.minLease, p.maxLease)
	p.one, p.full = limit.RefillTime(1), limit.RefillTime(p.capacity)
	return p
}

// maxPolicies bounds the policies a Limiter keeps for its LimitFunc's
// limits: beyond it, a limit's policy is made for each claim.
const maxPolicies = 1024

// policies holds the policy of each limit a LimitFunc answered, so that a
// key's claims find theirs without validating or allocating.
type policies struct {
	mu      sync.RWMutex
	byLimit map[tierlimit.Limit]*policy
}

// checkPolicy returns key's policy, having checked that a cost of n fits
// its limit (tierlimit.ErrInvalidCost).
func (l *Limiter) checkPolicy(key string, n int64) (*policy, error) {
	p, err := l.policyOf(key)
	if err != nil {
		return nil, err
	}
	if p != l.def && (n < 0 || n > p.capacity) {
		return nil, fmt.Errorf("%w: hybrid: key %q: n %d must be between 0 and %d", tierlimit.ErrInvalidCost, key, n, p.capacity)
	}
	return p, nil
}

// policyOf returns key's policy: its LimitFunc's answer, or the default.
// It returns an error wrapping tierlimit.ErrInvalidLimit when the answer
// is not a valid limit.
func (l *Limiter) policyOf(key string) (*policy, error) {
	if l.cfg.limitFunc == nil {
		return l.def, nil
	}
	limit := l.cfg.limitFunc(key)
	if limit == (tierlimit.Limit{}) || limit == l.def.limit {
		return l.def, nil
	}
	ps := &l.pols
	ps.mu.RLock()
	p, ok := ps.byLimit[limit]
	ps.mu.RUnlock()
	if ok {
		return p, nil
	}
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("hybrid: limit of key %q: %w", key, err)
	}
	p = newPolicy(limit, &l.cfg)
	p.own = limit
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if q, ok := ps.byLimit[limit]; ok {
		return q, nil
	}
	if len(ps.byLimit) < maxPolicies {
		p.counts = new(policyCounts)
		ps.byLimit[limit] = p
	}
	return p, nil
}

// policy returns the policy e's key follows: the one of its last claim.
func (e *entry) policy() *policy { return e.pol.Load() }

// denial is a denial under p with RetryAfter retry, from src.
func (p *policy) denial(retry time.Duration, src tierlimit.Source) tierlimit.Result {
	return tierlimit.Result{
		Limit: p.limit, RetryAfter: retry, Source: src,
		ResetAfter: p.limit.RefillTime(p.capacity),
	}
}

// shareOf returns what a key of policy p is held to while the breaker is
// open: WithFallbackLimit's limit, else p's limit divided by the live
// instances.
func (l *Limiter) shareOf(p *policy) tierlimit.Limit {
	if p == l.def || l.cfg.fallback != nil {
		return *l.share.Load()
	}
	return share(p.base, l.instances.Load())
}

// claim returns a claim of between lo and want tokens under p's limit.
func (p *policy) claim(lo, want int64) store.Claim {
	return store.Claim{Min: lo, Want: want, Limit: p.own}
}

// refund returns a refund of n tokens to key's bucket under p's limit,
// applied once (id).
func (p *policy) refund(key string, n int64, id string) store.Refund {
	return store.Refund{Key: key, N: n, ID: id, Limit: p.own}
}
