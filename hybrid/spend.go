package hybrid

// The decisions made in process: spending a lease, denying a key known to be
// blocked, and deciding while Redis cannot be reached.

import (
	"context"
	"fmt"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// lookup returns key's entry (see table.find).
func (l *limiter) lookup(key string) (*entry, bool) { return l.keys.find(key, keyHash(key)) }

// take takes n tokens from e's lease if it holds them, and returns what
// the lease holds after.
func (e *entry) take(n int64) (left int64, ok bool) {
	left = e.tokens.Load()
	for {
		if left < n {
			return left, false
		}
		if e.tokens.CompareAndSwap(left, left-n) {
			return left - n, true
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

// expiring asks for a background refill of e's lease when it expires
// within a quarter of the lease TTL: a key still asked then renews its
// lease off the callers' path, where the janitor would refund it and the
// key's next caller would claim and wait. spend calls it at some arrivals
// only (the 1st, 2nd, 4th, ... and every expiryCheck-th since the claim):
// a clock read at every decision would cost more than the rest of it.
func (l *limiter) expiring(e *entry) {
	if e.policy().maxLease == 1 {
		return // exact mode: a lease is one token, claimed by its caller
	}
	if exp := e.expires.Load(); exp > 0 && l.now() > exp-int64(l.cfg.leaseTTL/4) {
		l.refill(e)
	}
}

// expiryCheck is how many arrivals apart, beyond the powers of two, spend
// checks whether a lease is expiring.
const expiryCheck = 64

// low asks for a background refill of e's lease when what it holds, left,
// is down to a quarter of the last grant.
func (l *limiter) low(e *entry, left int64) {
	if size := e.lastSize.Load(); size > 1 && left <= size/4 {
		l.refill(e)
	}
}

// spend takes n tokens from e's lease if it holds them. A barred key's
// lease is not spent (see asked): the call is denied, until the answer
// that barred it is a lease TTL old and a claim asks again.
func (l *limiter) spend(e *entry, n int64, src tierlimit.Source) (tierlimit.Result, bool) {
	until := e.blockedUntil.Load()
	if until == bar {
		if !l.fresh(e, l.now()) {
			return tierlimit.Result{}, false
		}
		return l.record(barredPolicy, barred(), e.stripe), true
	}
	if src == tierlimit.SourceLocal && until == 0 {
		// Every call that finds the key is an arrival, whether its lease
		// holds n or it goes on to claim (spend's other callers): demand
		// counts what callers ask, not what was decided in time (see size).
		// A key Redis blocked is not counted: its next lease is what Redis
		// grants, and the denials stay reads of e's line, which cores
		// deciding one saturated key then share (BenchmarkCompare's hot
		// key, parallel).
		if d := e.demand.Add(n); d&(d-1) == 0 || d%expiryCheck == 0 {
			l.expiring(e)
		}
	}
	left, ok := e.take(n)
	if !ok {
		return tierlimit.Result{}, false
	}
	l.low(e, left)
	pol := e.policy()
	remaining := min(left+e.remote.Load(), pol.capacity)
	if src == tierlimit.SourceLocal {
		l.countLocal(e)
	} else {
		l.tally(pol, src, true, e.stripe)
	}
	return tierlimit.Result{
		Allowed:    true,
		Limit:      pol.limit,
		Remaining:  remaining,
		ResetAfter: pol.limit.RefillTime(pol.capacity - remaining),
		Source:     src,
	}, true
}

// blocked returns a denial from src while Redis is known to hold fewer than
// n tokens for e's key.
func (l *limiter) blocked(e *entry, n int64, src tierlimit.Source) (tierlimit.Result, bool) {
	until := e.blockedUntil.Load()
	if until == 0 || until == bar || n == 0 { // a barred key: see spend
		return tierlimit.Result{}, false
	}
	now := l.now()
	if now >= until {
		return tierlimit.Result{}, false
	}
	held := e.tokens.Load()
	need := n - held - max(0, e.remote.Load())
	if need <= 0 {
		// The lease and what Redis last had hold n together: one bucket
		// would admit, so the caller claims the rest.
		return tierlimit.Result{}, false
	}
	// The wait is for this caller's n tokens: until the block ends, and
	// at least until what the lease lacks can have accrued in Redis since
	// it last answered (G2).
	pol := e.policy()
	wait := max(time.Duration(until-now), pol.refillTime(need)-time.Duration(now-e.lastClaim.Load()))
	return tierlimit.Result{
		Limit:      pol.limit,
		Remaining:  held,
		RetryAfter: wait,
		ResetAfter: pol.refillTime(pol.capacity - held),
		Source:     src,
	}, true
}

// peek answers n == 0: what the lease and Redis hold, charging nothing.
func (l *limiter) peek(ctx context.Context, key string, p *policy) (tierlimit.Result, error) {
	var res tierlimit.Result
	ev, err := l.call("peek", l.cfg.callBudget, func() error {
		cctx, cancel := l.budget(ctx)
		defer cancel()
		var err error
		_, res, err = l.bucket.Lease(cctx, key, p.claim(0, 0))
		return err
	})
	l.report(&ev)
	switch {
	case l.bucket.Misconfigured(err):
		return tierlimit.Result{}, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err)
	case err != nil:
		return l.fall(ctx, key, p, 0)
	}
	return l.record(p, res, 0), nil
}

// missed decides a call whose claim failed or ran past the call budget.
// Unless the breaker is closed that is an outage, which the failure mode
// decides (fall). Otherwise Redis may only be slow, and in FailFallback mode
// no fallback bucket mints tokens for it (G1): a lease that landed
// meanwhile is spent, a key known to be blocked stays blocked, and
// anything else is denied for a budget's time; the claim, if it lands, is
// spent by the next callers.
func (l *limiter) missed(ctx context.Context, key string, p *policy, n int64) (tierlimit.Result, error) {
	if l.brk.current() != tierlimit.BreakerClosed || l.cfg.failureMode != FailFallback {
		return l.fall(ctx, key, p, n)
	}
	if e, ok := l.lookup(key); ok {
		if res, ok := l.spend(e, n, tierlimit.SourceRemote); ok {
			return res, nil
		}
		if res, ok := l.blocked(e, n, tierlimit.SourceBlocked); ok {
			return l.record(e.policy(), res, e.stripe), nil
		}
	}
	if err := l.misconfig.Load(); err != nil {
		return tierlimit.Result{}, *err
	}
	return l.record(p, p.denial(l.cfg.callBudget, tierlimit.SourceFallback), 0), nil
}

// fall decides while Redis cannot be reached: a lease still held is spent
// first, then the failure mode decides, unless Redis's last word was a
// misconfiguration: that is an error.
func (l *limiter) fall(ctx context.Context, key string, p *policy, n int64) (tierlimit.Result, error) {
	if e, ok := l.lookup(key); ok {
		if res, ok := l.spend(e, n, tierlimit.SourceFallback); ok {
			return res, nil
		}
	}
	if err := l.misconfig.Load(); err != nil {
		return tierlimit.Result{}, *err
	}
	switch l.cfg.failureMode {
	case FailOpen:
		return l.record(p, tierlimit.Result{Allowed: true, Limit: p.limit, Source: tierlimit.SourceFallback}, 0), nil
	case FailClosed:
		return l.record(p, p.denial(l.cfg.probeInterval, tierlimit.SourceFallback), 0), nil
	}
	now := l.cfg.clock.Now()
	e := l.entry(key, p)
	if e.owed.Load() == 0 && l.keys.droppedLen() >= l.cfg.maxKeys {
		// The table follows WithMaxKeys dropped entries already: it cannot
		// follow one more debt (G6), and a bucket forgotten at every call
		// would admit without bound (G1). Deny, as a key known to be
		// blocked is.
		return l.record(p, p.denial(l.cfg.probeInterval, tierlimit.SourceFallback), e.stripe), nil
	}
	fb := l.fallbackOf(e, now)
	res := fb.lim.Decide(now, n)
	res.Source = tierlimit.SourceFallback
	if res.Allowed {
		e.owed.Add(n)
		if e.evicted.Load() {
			l.keys.keep(e) // after the Add: see table.forget
		}
	}
	return l.record(e.policy(), res, e.stripe), nil
}

// fallback is a key's bucket while the breaker is open (mode FailFallback):
// an exact token bucket (xrate) at the instance's share of the limit, for
// one outage.
type fallback struct {
	epoch int64 // the breaker's opening it belongs to (breaker.opens)
	lim   *xrate.Bucket
}

// fallbackOf returns e's bucket for the outage under way, made by the first
// fallback decision after the breaker opened. It starts from what Redis
// last said the key had, divided by the live instances: nothing for a key
// known to be blocked, nor for a key this instance never claimed, which
// other instances may have drained (G1: an outage where Redis keeps its
// state hands out no fresh burst). The share's rate flows from the start.
func (l *limiter) fallbackOf(e *entry, now time.Time) *fallback {
	epoch := l.brk.opens.Load()
	old := e.fb.Load()
	if old != nil && old.epoch == epoch {
		return old
	}
	share := l.shareOf(e.policy())
	var tokens int64
	if e.lastClaim.Load() != 0 && e.blockedUntil.Load() <= l.now() {
		tokens = e.remote.Load() / max(1, l.instances.Load())
	}
	fb := &fallback{epoch: epoch, lim: xrate.NewWith(share, tokens, now)}
	if e.fb.CompareAndSwap(old, fb) {
		return fb
	}
	return e.fb.Load()
}
