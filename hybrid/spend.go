package hybrid

// The decisions made in process: spending a lease, and denying a key known
// to be blocked.

import (
	"time"

	"github.com/tierlimit/tierlimit"
)

// take takes between n and most tokens (n <= most) from e's lease, as
// many as it holds, if it holds n and has not expired; it returns how
// many, and what the lease holds after.
func (e *entry) take(n, most int64) (got, left int64, ok bool) {
	left = e.tokens.Load()
	if e.expired.Load() {
		return 0, left, false
	}
	for {
		if left < n {
			return 0, left, false
		}
		got = min(left, most)
		if e.tokens.CompareAndSwap(left, left-got) {
			return got, left - got, true
		}
		left = e.tokens.Load()
	}
}

// spent records that n tokens of e's lease were spent, leaving left, by a
// call that spend did not count as an arrival (AllowAll): the key's
// demand, and a background refill when the lease runs low.
func (l *limiter) spent(e *entry, n, left int64) {
	e.demand.Add(n)
	l.low(e, left)
}

// low asks for a background refill of e's lease when what it holds, left,
// is down to half the last grant: the other half is what its callers spend
// while the refill is queued and answered, and when it runs out first they
// wait for the refill (a probe of 10,000 keys asked in turn beside a busy
// loop: 11-27 such waits in a round of 0.5 s at a quarter, 5-23 at half).
// Exact mode (leases of one token) refills nothing: a grant of several
// tokens there is one caller's (AllowN(n), AllowAtMost), not a lease.
func (l *limiter) low(e *entry, left int64) {
	if size := e.lastSize.Load(); size > 1 && left <= size/2 && e.policy().maxLease > 1 {
		l.refill(e)
	}
}

// leased decides a take of between n and most tokens from e's lease
// (spend, a decision from spent) or, when it holds too few, from the key's
// known block (blocked, a denial from denied), writing the Result into res
// and returning how many tokens it took; false when neither can decide,
// res untouched. The Result is written in place, not returned: it is
// eight words, and AllowN's callers would copy it up through each call
// (bench/RESULTS.md).
func (l *limiter) leased(res *tierlimit.Result, e *entry, n, most int64, spent, denied tierlimit.Source) (int64, bool) {
	if got, ok := l.spend(res, e, n, most, spent); ok {
		return got, true
	}
	if l.blocked(res, e, n, denied) {
		l.tally(e.policy(), denied, false, e.stripe)
		return 0, true
	}
	return 0, false
}

// spend takes between n and most tokens (n <= most; AllowN's are equal)
// from e's lease if it holds n, as many as it holds, writes the Result
// into res and returns how many; false when the lease holds fewer than n,
// res untouched. A barred key's lease is not spent (see asked): the call
// is denied, until the answer that barred it is a lease TTL old and a
// claim asks again.
func (l *limiter) spend(res *tierlimit.Result, e *entry, n, most int64, src tierlimit.Source) (int64, bool) {
	until := e.blockedUntil.Load()
	if until == bar {
		if !l.fresh(e, l.now()) {
			return 0, false
		}
		*res = l.record(barredPolicy, barred(), e.stripe)
		return 0, true
	}
	if n == 0 && until != 0 && knownShort(e, l.now()) {
		// A peek at a key Redis is short on (in debt, it is denied): Redis
		// answers it.
		return 0, false
	}
	if src == tierlimit.SourceLocal && until == 0 {
		// Every call that finds the key is an arrival, whether its lease
		// holds n or it goes on to claim (spend's other callers): demand
		// counts what callers ask, not what was decided in time (see size).
		// A key Redis blocked is not counted: its next lease is what Redis
		// grants, and the denials stay reads of e's line, which cores
		// deciding one saturated key then share (BenchmarkCompare's hot
		// key, parallel).
		ask := n
		if most > n {
			ask = min(most, e.policy().capacity) // AllowAtMost's: see claimInto
		}
		e.demand.Add(ask)
	}
	got, left, ok := e.take(n, most)
	if !ok {
		return 0, false
	}
	l.low(e, left)
	pol := e.policy()
	remaining := min(left+e.remote.Load(), pol.capacity)
	if src == tierlimit.SourceLocal {
		l.countLocal(e)
	} else {
		l.tally(pol, src, true, e.stripe)
	}
	*res = tierlimit.Result{
		Allowed:    true,
		Limit:      pol.limit,
		Remaining:  remaining,
		ResetAfter: pol.limit.RefillTime(pol.capacity - remaining),
		Source:     src,
	}
	return got, true
}

// knownShort reports whether Redis is known to hold too few tokens for
// e's key at now (blocked, or in debt), a key the LimitFunc bars aside.
func knownShort(e *entry, now int64) bool {
	until := e.blockedUntil.Load()
	return until != bar && now < until
}

// blocked writes into res a denial from src, uncounted, while Redis is
// known to hold fewer than n tokens for e's key; false otherwise, res
// untouched.
func (l *limiter) blocked(res *tierlimit.Result, e *entry, n int64, src tierlimit.Source) bool {
	until := e.blockedUntil.Load()
	if until == 0 || until == bar || n == 0 { // a barred key: see spend
		return false
	}
	now := l.now()
	if now >= until {
		return false
	}
	held := e.tokens.Load()
	need := n - held - max(0, e.remote.Load())
	if need <= 0 {
		// The lease and what Redis last had hold n together: one bucket
		// would admit, so the caller claims the rest.
		return false
	}
	pol := e.policy()
	if src == tierlimit.SourceBlocked && pol.maxLease > 1 && until-now <= l.preclaim(e) {
		// The block ends soon (preclaim): the key's next lease is
		// claimed in the background, to land about when it ends, rather
		// than by the first caller after it, who would wait for it.
		l.refill(e)
	}
	// The wait is for this caller's n tokens: until the block ends, and
	// at least until what the lease lacks can have accrued in Redis since
	// it last answered (G2).
	wait := max(time.Duration(until-now), pol.refillTime(need)-time.Duration(now-e.lastClaim.Load()))
	*res = tierlimit.Result{
		Limit:      pol.limit,
		Remaining:  held,
		RetryAfter: wait,
		ResetAfter: pol.refillTime(pol.capacity - held),
		Source:     src,
	}
	return true
}
