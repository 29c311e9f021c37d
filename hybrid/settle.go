package hybrid

// Settling a charge after the fact.

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// Settle corrects a charge of key after the fact: charged events were
// taken, used is what they really cost (an LLM request charged its
// estimate, then its real number of tokens). When used < charged the
// difference is given back, never above the key's Burst; when used >
// charged the difference is taken too, and what the key lacks of it is
// debt, down to minus its Burst: the events happened, so Settle never
// denies, and the key is denied (RetryAfter counting the debt) until its
// rate has repaid it (docs/design.md, "Debt"). charged must be between 0
// and the key's Burst (it was admitted), used at least 0
// (tierlimit.ErrInvalidCost); used may pass the Burst, and what the debt
// floor cuts off of it is the Result's Uncharged (when Redis answered the
// take within the call budget; 0 if it did not). charged is trusted: a
// give-back of tokens that were never charged refills the key all the
// same, up to its Burst.
//
// A whole charge given back (used 0) is reported to the observer's
// GiveBack (WithObserver).
//
// Settle gives back through the key's lease when the lease it was spent
// from is still held (no Redis call), else to Redis (one call); it takes
// from the lease what it holds, and what the lease lacks from Redis (one
// call). It waits for Redis at most the call budget (WithCallBudget): a
// call still running then goes on after Settle returns, and its Result is
// this instance's estimate. A Redis fault never reaches the caller: what
// could not be given back is counted in Stats.Lost, what could not be
// taken is charged when Redis answers again, as the fallback's admissions
// are.
func (l *Limiter) Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	res, err := l.settle(ctx, key, charged, used)
	if err != nil {
		return res, named(err)
	}
	if used == 0 && charged > 0 && !res.Limit.IsBlocked() && l.onGiveBack != nil {
		l.onGiveBack(tierlimit.GiveBack{Source: res.Source, N: charged, Limit: res.Limit})
	}
	return res, nil
}

// settle is Settle, but for the observer.
func (l *limiter) settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	if err := l.check(ctx, key, 0); err != nil {
		return tierlimit.Result{}, err
	}
	p, err := l.checkPolicy(key, 0)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if p.blocked {
		return barred(), nil // nothing to correct: the key takes nothing
	}
	if err := p.checkCost(key, charged); err != nil {
		return tierlimit.Result{}, err
	}
	if used < 0 {
		return tierlimit.Result{}, fmt.Errorf("hybrid: %w: key %q: used %d must be >= 0", tierlimit.ErrInvalidCost, key, used)
	}
	h := keyHash(key)
	if !l.keys.enter(h) {
		return tierlimit.Result{}, tierlimit.ErrClosed
	}
	defer l.keys.exit(h)
	e := l.entry(key, p)
	switch d := charged - used; {
	case d > 0 && l.giveToLease(e, d):
		return l.settled(e, tierlimit.SourceLocal), nil
	case d > 0:
		l.detachKey(ctx, h, l.cfg.callBudget, func() { l.giveToRedis(e, d) })
	case d < 0:
		// The lease first, then Redis for what it lacks.
		rest := -d - l.takeUpTo(e, -d)
		if rest == 0 {
			return l.settled(e, tierlimit.SourceLocal), nil
		}
		var called atomic.Bool
		var uncharged atomic.Int64
		called.Store(true) // until takeFromRedis says otherwise
		l.detachKey(ctx, h, l.cfg.callBudget, func() {
			c, u := l.takeFromRedis(ctx, e, rest)
			uncharged.Store(u)
			called.Store(c)
		})
		src := tierlimit.SourceRemote
		if !called.Load() {
			src = tierlimit.SourceLocal
		}
		res := l.settled(e, src)
		res.Uncharged = uncharged.Load()
		return res, nil
	}
	return l.settled(e, tierlimit.SourceRemote), nil
}

// settled is Settle's Result: what e's lease and Redis hold, as far as
// this instance knows.
func (l *limiter) settled(e *entry, src tierlimit.Source) tierlimit.Result {
	p := e.policy()
	remaining := min(e.tokens.Load()+max(0, e.remote.Load()), p.capacity)
	return tierlimit.Result{
		Allowed:    true,
		Limit:      p.limit,
		Remaining:  remaining,
		ResetAfter: p.limit.RefillTime(p.capacity - remaining),
		Source:     src,
	}
}

// giveToLease gives d tokens back to e's lease if it is live and its
// ledger record still covers them (e.covered): they were spent from the
// lease since its last claim, and the lease, which Redis debited, goes
// back to Redis at its TTL anyway. Tokens the record no longer counts (a
// later claim, granted or denied, lowered it to what the lease held then:
// Redis's ceiling rose by them), or a lease that has expired, give
// nothing: Redis's bucket takes them, capped at Burst.
func (l *limiter) giveToLease(e *entry, d int64) bool {
	// The key lock orders the give-back with e's claims: a claim sends
	// what e holds (Claim.Held), and its ledger record then covers only
	// that; tokens given to the lease while a claim is in flight would be
	// more than the record holds, and its refund could not return them.
	// With a claim in flight the tokens go to Redis instead.
	mu := l.keyLock(e.key)
	if !mu.TryLock() {
		return false
	}
	defer mu.Unlock()
	now := l.now()
	if e.stale.Load() || e.evicted.Load() || e.expires.Load() <= now || knownShort(e, now) {
		// A key Redis is known to be short on (in debt, say) takes the
		// tokens there, where they repay what it lacks first.
		return false
	}
	covered := e.covered.Load()
	for {
		t := e.tokens.Load()
		if t+d > covered {
			return false
		}
		if e.tokens.CompareAndSwap(t, t+d) {
			return true
		}
	}
}

// cancelOwed cancels up to d tokens of what e owes Redis and returns how
// many: a give-back of tokens that were never charged to the bucket.
func cancelOwed(e *entry, d int64) int64 {
	for {
		o := e.owed.Load()
		n := min(o, d)
		if n <= 0 || e.owed.CompareAndSwap(o, o-n) {
			return max(n, 0)
		}
	}
}

// takeUpTo takes up to d tokens from e's lease, if it has not expired,
// and returns how many.
func (l *limiter) takeUpTo(e *entry, d int64) int64 {
	if e.expired.Load() {
		return 0
	}
	for {
		t := e.tokens.Load()
		n := min(t, d)
		if n <= 0 || e.tokens.CompareAndSwap(t, t-n) {
			return max(n, 0)
		}
	}
}

// giveToRedis refunds d tokens to e's bucket (capped at Burst there) in
// one call; if it fails they are lost (Stats.Lost). The refund ends e's
// record, whose count of what e may still spend would
// otherwise cap the refund (the bucket refills only up to what records
// leave): e's lease goes back with it, as the janitor's refund takes it,
// and d as spent tokens given back (store.Refund.Spent).
func (l *limiter) giveToRedis(e *entry, d int64) {
	mu := l.keyLock(e.key)
	mu.Lock()
	defer mu.Unlock()
	if e.stale.Load() {
		return // Reset refilled the bucket
	}
	// What the key owes Redis (admitted while Redis was away, or taken by
	// a Settle that could not reach it) is cancelled first.
	if d -= cancelOwed(e, d); d == 0 {
		return
	}
	p := e.policy()
	r := p.refund(e.key, e.tokens.Swap(0), l.refundID())
	r.Spent = d
	r.Holder, r.Gen, r.Received, r.Live = e.holder, e.gen.Add(1), e.received.Load(), l.live(e)
	e.lost.Store(false)
	e.expires.Store(0) // the refund ends e's record
	e.covered.Store(0)
	if l.refund([]store.Refund{r}, false) == nil {
		// Redis holds what it held and r.N + r.Spent more, up to its
		// capacity (less what other holders hold): what Settle's Result
		// reports.
		e.remote.Store(min(max(0, e.remote.Load())+r.N+r.Spent, p.capacity))
		// What blocked the key may be repaid: the next call asks Redis.
		if until := e.blockedUntil.Load(); until != bar {
			e.blockedUntil.CompareAndSwap(until, 0)
		}
	}
}

// takeFromRedis takes d tokens from e's bucket in one call: what the
// bucket lacks is its debt, down to minus its capacity (store.Claim.Debt),
// and what that floor cuts off is returned uncharged.
// If the call fails, e owes d, charged when Redis answers again as the
// fallback's admissions are (up to what the bucket holds then). Tokens a
// refill landed in e's lease since the caller looked are taken first,
// under the key lock, which refills hold until they land: it reports
// whether Redis was called.
func (l *limiter) takeFromRedis(ctx context.Context, e *entry, d int64) (called bool, uncharged int64) {
	mu := l.keyLock(e.key)
	mu.Lock()
	defer mu.Unlock()
	if d -= l.takeUpTo(e, d); d == 0 || e.stale.Load() {
		return false, 0
	}
	c := l.claimOf(e, 0, d)
	c.Debt = true // what the bucket lacks of d is its debt
	granted, res, ev, err := l.leaseCall(ctx, "settle", e.key, c)
	l.report(&ev)
	l.replied(e, granted, err)
	if err != nil {
		// No bucket takes more than twice its capacity, from full to
		// its floor: past that nothing is owed.
		most := 2 * e.policy().capacity
		e.owed.Add(min(d, most))
		if e.evicted.Load() {
			l.keys.keep(e) // after the Add: see table.forget
		}
		return true, max(d-most, 0)
	}
	// More than d granted is an earlier claim's grant whose reply was lost,
	// handed over now (store.Claim.Received): the lease's. What is left, spent by the
	// events settled, may hold some of it too: debited all the same.
	if extra := granted - d; extra > 0 {
		l.stats.leased.Add(extra)
		l.land(e, extra)
		granted = d
	}
	l.stats.leased.Add(granted) // spent by the events settled
	now := l.now()
	e.remote.Store(res.Remaining)
	l.claimed(e, now)
	if debt := d - granted; debt > 0 {
		// The bucket lacked debt tokens: it is at least that far below
		// empty (down to minus its capacity), and no call is admitted
		// before the rate has repaid them and accrued one more.
		p := e.policy()
		e.blockedUntil.Store(now + int64(p.refillTime(min(debt, p.capacity)+1)))
	}
	return true, res.Uncharged
}
