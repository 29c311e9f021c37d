package hybrid

// Per-key limits (WithLimitFunc): each entry follows its key's policy.

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
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
	blocked            bool            // the LimitFunc's tierlimit.Blocked: every call is denied (barred)
}

// barredPolicy is the policy of keys whose LimitFunc answer is
// tierlimit.Blocked. Nothing is ever claimed, refunded or counted under
// it: an entry of a barred key keeps its last limit's policy (its lease
// goes back under it) and is marked barred.
var barredPolicy = &policy{limit: tierlimit.Blocked, blocked: true}

// barred is the denial of every call of a barred key.
func barred() tierlimit.Result {
	return tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}
}

// bar is blockedUntil's value for an entry whose key is barred.
const bar = math.MaxInt64

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

// checkPolicy returns key's policy (see policyFor), having checked that a
// cost of n fits its limit (tierlimit.ErrInvalidCost).
func (l *limiter) checkPolicy(key string, n int64) (*policy, error) {
	p, err := l.policyFor(key)
	if err != nil {
		return nil, err
	}
	if err := p.checkCost(key, n); err != nil {
		return nil, err
	}
	return p, nil
}

// fits reports whether a cost of n keeps p's rule, the one of every
// method's cost: between 0 and p's capacity, and any n >= 0 for a blocked
// key (denied, not refused).
func (p *policy) fits(n int64) bool { return n >= 0 && (p.blocked || n <= p.capacity) }

// checkCost returns an error wrapping tierlimit.ErrInvalidCost for a cost
// of key that does not fit p (see fits).
func (p *policy) checkCost(key string, n int64) error {
	if p.fits(n) {
		return nil
	}
	return fmt.Errorf("hybrid: %w: key %q: n %d must be between 0 and %d", tierlimit.ErrInvalidCost, key, n, p.capacity)
}

// policyFor returns key's policy, asking the LimitFunc at most once per
// lease TTL for a key the limiter follows: its entry holds the answer
// until it is a lease TTL old, on every path (claims, AllowAll, Settle,
// WaitN). A key without an entry asks at once; the claim that follows
// makes its entry. No lock is held while the LimitFunc runs: a panic
// reaches the caller and leaves the limiter as it was.
func (l *limiter) policyFor(key string) (*policy, error) {
	if !l.cfg.lookup.Set() {
		return l.def, nil
	}
	e, ok := l.lookup(key)
	if !ok {
		e, ok = l.keys.droppedFor(key)
	}
	now := l.now()
	if ok && l.fresh(e, now) {
		if e.blockedUntil.Load() == bar {
			return barredPolicy, nil
		}
		return e.policy(), nil
	}
	p, err := l.policyOf(key)
	if err != nil {
		return nil, err
	}
	if ok {
		l.asked(e, p, now)
	}
	return p, nil
}

// fresh reports whether the LimitFunc's answer e holds is less than a
// lease TTL old at now.
func (l *limiter) fresh(e *entry, now int64) bool {
	return now-e.asked.Load() < int64(l.cfg.leaseTTL)
}

// asked records that the LimitFunc answered p for e's key at now. A
// barred key's entry stops spending and its lease expires now: the
// janitor's next round gives it back.
func (l *limiter) asked(e *entry, p *policy, now int64) {
	switch {
	case p.blocked:
		e.blockedUntil.Store(bar)
		e.expires.Store(0)
	case e.blockedUntil.Load() == bar:
		e.blockedUntil.Store(0)
		fallthrough
	case e.policy() != p:
		e.pol.Store(p)
	}
	e.asked.Store(now)
}

// reask asks the LimitFunc again for e's key if e's answer is a lease TTL
// old, for a background refill, which holds no lock here: a hot key,
// whose lease is refilled before it runs dry, follows a changed answer
// within a lease TTL too. It reports whether e may be refilled: an answer
// that is not a valid limit, or a panic of the LimitFunc, stops e's
// background refills, and the next call that claims for the key asks
// again and returns what the LimitFunc did.
func (l *limiter) reask(e *entry, now int64) (ok bool) {
	if !l.cfg.lookup.Set() || l.fresh(e, now) {
		return true
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p, err := l.policyOf(e.key)
	if err != nil {
		return false
	}
	l.asked(e, p, now)
	return !p.blocked
}

// LimitFor returns key's limit: the LimitFunc's answer (WithLimitFunc),
// tierlimit.Blocked for a key it blocks, or the default. For a key the
// limiter follows it asks the LimitFunc at most once per lease TTL, as
// decisions do. Its error wraps tierlimit.ErrInvalidKey for a bad key,
// tierlimit.ErrInvalidLimit for an answer that is not a valid limit and
// tierlimit.ErrLimitLookup for a failed lookup (WithLimitLookup).
func (l *Limiter) LimitFor(key string) (tierlimit.Limit, error) {
	if err := check.Key(key); err != nil {
		return tierlimit.Limit{}, named(err)
	}
	p, err := l.policyFor(key)
	if err != nil {
		return tierlimit.Limit{}, named(err)
	}
	return p.limit, nil
}

// policyOf returns key's policy: its LimitFunc's answer, or the default.
// It returns an error wrapping tierlimit.ErrInvalidLimit when the answer
// is not a valid limit, and one wrapping tierlimit.ErrLimitLookup when a
// LimitLookup failed (and does not fail open).
func (l *limiter) policyOf(key string) (*policy, error) {
	if !l.cfg.lookup.Set() {
		return l.def, nil
	}
	limit, err := l.cfg.lookup.Limit(key)
	switch {
	case err != nil:
		return nil, named(err)
	case limit == tierlimit.Limit{}, limit == l.def.limit:
		return l.def, nil
	case limit.IsBlocked():
		return barredPolicy, nil
	}
	return l.pols.Get(limit, func() (*policy, error) {
		if err := limit.Validate(); err != nil {
			return nil, fmt.Errorf("hybrid: %w (limit of key %q)", err, key)
		}
		p := newPolicy(limit, &l.cfg)
		p.own = limit
		// Stats.Limits reads the counts of the policies the cache keeps;
		// past perlimit.Max limits, one made anew at each call counts in
		// the totals only.
		p.counts = new(policyCounts)
		return p, nil
	})
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

// claim returns a claim of between lo and want tokens under p's limit.
func (p *policy) claim(lo, want int64) store.Claim {
	return store.Claim{Min: lo, Want: want, Limit: p.own}
}

// refund returns a refund of n tokens to key's bucket under p's limit,
// applied once (id).
func (p *policy) refund(key string, n int64, id string) store.Refund {
	return store.Refund{Key: key, N: n, ID: id, Limit: p.own}
}
