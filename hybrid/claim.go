package hybrid

// Claims: the decisions that ask Redis for a lease (or peek at the bucket),
// and how big a lease is.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
	"golang.org/x/sync/singleflight"
)

// claim decides a call the lease could not: one Redis call per key at a
// time, shared by the callers waiting on it. No caller waits longer than the
// call budget. With a client that honours context deadlines the budget ends
// the call itself, and the caller that leads the shared call makes it on
// its own goroutine. With one that does not, callers wait on the shared
// call's channel with a timer, and a call still running at the budget goes
// on in its flight's goroutine and lands its tokens in the entry for later
// callers: a goroutine hand-off more per claim, which the first way saves.
//
// The call takes between n and most tokens (n <= most; AllowN's are
// equal), as many as the lease holds after the claim, and claim returns
// how many.
func (l *limiter) claim(ctx context.Context, key string, h uint64, n, most int64) (tierlimit.Result, int64, error) {
	var res tierlimit.Result
	p, err := l.checkPolicy(key, n)
	if err != nil {
		return tierlimit.Result{}, 0, err
	}
	if p.blocked {
		return l.record(p, barred(), 0), 0, nil
	}
	if n > 0 && l.brk.open() {
		return l.fall(key, p, n, most)
	}
	// The caller waits on Redis from here (see stalls): not while the
	// breaker is open, when every caller falls back at once.
	l.stalled.begin(l.now())
	defer func() { l.stalled.end(l.now()) }()
	if n == 0 {
		res, err := l.peek(ctx, key, p)
		return res, 0, err
	}
	expiry, stop := l.expiry()
	defer stop()
	// A claim shared with other callers may leave too few tokens for this
	// one: claim again, a bounded number of times.
	for attempt := 0; attempt < 4; attempt++ {
		if e, ok := l.lookup(key); ok {
			// A background refill in flight is this caller's claim too.
			if e.refillDone.Load() != nil {
				if err := l.awaitRefill(ctx, e, expiry()); err != nil {
					return tierlimit.Result{}, 0, err
				}
			}
			if l.enough(e, n, most) {
				if got, ok := l.leased(&res, e, n, most, tierlimit.SourceRemote, tierlimit.SourceRemote); ok {
					return res, got, nil
				}
			}
		}
		e, err := l.shared(ctx, key, h, p, n, most, expiry)
		switch {
		case err == errMissed:
			return l.missed(ctx, key, p, n, most)
		case err != nil:
			return tierlimit.Result{}, 0, err
		}
		if got, ok := l.leased(&res, e, n, most, tierlimit.SourceRemote, tierlimit.SourceRemote); ok {
			return res, got, nil
		}
		if err := ctx.Err(); err != nil {
			return tierlimit.Result{}, 0, err
		}
	}
	// Other callers keep taking what is claimed: deny this one briefly.
	return l.record(p, p.denial(p.limit.RefillTime(1), tierlimit.SourceRemote), 0), 0, nil
}

// errMissed is shared's error for a claim that failed or ran past the
// call budget: the caller decides without Redis (missed).
var errMissed = errors.New("hybrid: claim missed")

// shared makes key's claim of at least n tokens (and, if the key holds
// them, most), or joins the one in flight, and returns key's entry. Its
// errors are ErrClosed, ctx's, ErrMisconfigured's, and errMissed. expiry is
// claim's budget timer.
func (l *limiter) shared(ctx context.Context, key string, h uint64, p *policy, n, most int64, expiry func() <-chan struct{}) (*entry, error) {
	fn := func() (any, error) {
		// The flight may outlive its caller: it is a call in flight of
		// its own, which Close waits for.
		if !l.keys.enter(h) {
			return nil, tierlimit.ErrClosed
		}
		defer l.keys.exit(h)
		return l.lease(ctx, key, p, n, most)
	}
	var r singleflight.Result
	if l.inline {
		r.Val, r.Err, _ = l.flights.Do(key, fn)
	} else {
		select {
		case r = <-l.flights.DoChan(key, fn):
		case <-expiry():
			return nil, errMissed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch {
	case r.Err == nil:
		return r.Val.(*entry), nil
	case r.Err == tierlimit.ErrClosed:
		return nil, r.Err
	case l.bucket.Misconfigured(r.Err):
		return nil, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, r.Err)
	}
	return nil, errMissed
}

// lease claims tokens for key into its entry, so that it holds at least n
// (or it claims nothing), at most the lease size or most, whichever is
// larger. It returns the entry.
func (l *limiter) lease(ctx context.Context, key string, p *policy, n, most int64) (*entry, error) {
	e := l.entry(key, p)
	held := e.spendable()
	if held >= n && l.enough(e, n, most) {
		return e, nil // a refill landed meanwhile
	}
	// The lease's tokens count: n - held more are enough, as one bucket
	// would admit n from what the lease and Redis hold together.
	if err := l.claimInto(ctx, e, max(n-held, 0), most-held); err != nil {
		return nil, err
	}
	return e, nil
}

// claimInto asks Redis for between lo and the lease size tokens for e, or
// up to hi if that is more (AllowAtMost's caller asks for hi at most, up to
// the key's capacity). The key's lock orders it with Reset: tokens debited
// before Reset's DEL are erased by it and must not be refunded after it.
func (l *limiter) claimInto(ctx context.Context, e *entry, lo, hi int64) error {
	var ev, debt tierlimit.RedisCall
	defer l.report(&ev)
	defer l.report(&debt)
	mu := l.keyLock(e.key)
	mu.Lock()
	defer mu.Unlock()
	if e.stale.Load() {
		return nil // the caller finds no tokens and claims into a new entry
	}
	if e.owed.Load() > 0 {
		// What the fallback admitted in an outage is charged before the
		// key takes anything new (see chargeBack).
		if err := l.payDebt(ctx, e, &debt); err != nil {
			return err
		}
	}
	now := l.now()
	want := max(l.size(e, lo, now), min(hi, e.policy().capacity))
	granted, res, ev, err := l.leaseCall(ctx, "claim", e.key, l.claimOf(e, lo, want))
	l.replied(e, granted, err)
	if err != nil {
		return err
	}
	l.apply(e, want, granted, res)
	return nil
}

// claimOf returns the claim of between lo and want tokens for e: numbered,
// with what e holds now and what its replies granted. The caller holds e's
// key lock: e's claims and refunds are numbered in the order they are
// made.
//
// The claim, if it runs, lowers e's record to what e holds now (and what
// replies e never got carried), granted or denied: from then on the record
// covers only that (e.covered), and what the reply grants (replied).
func (l *limiter) claimOf(e *entry, lo, want int64) store.Claim {
	c := e.policy().claim(lo, want)
	c.Holder, c.Gen, c.Held, c.Received = e.holder, e.gen.Add(1), e.tokens.Load(), e.received.Load()
	c.Live = l.live(e)
	e.covered.Store(min(e.covered.Load(), c.Held))
	return c
}

// replied records, under e's key lock, that a claim of e's got Redis's
// reply granting granted, or failed with err. A claim whose call failed
// may still have run: the ledger then holds what it granted, and hands it
// to e's next claim (store.Claim.Received) or takes it back with e's next
// refund, which the janitor sends for it (lost). An error reply ran
// nothing.
func (l *limiter) replied(e *entry, granted int64, err error) {
	var reply redis.Error
	switch {
	case err == nil:
		e.received.Add(granted)
		e.covered.Add(granted)
		return
	case errors.As(err, &reply) || l.bucket.Misconfigured(err):
		return
	}
	e.lost.Store(true)
	if e.evicted.Load() {
		l.keys.keep(e) // after the Store: see table.forget
	}
}

// apply records a claim of want tokens in e: a use of the key for
// ristretto's admission policy (the front table answers its spends), the
// tokens granted, the demand measurement restarted, and the key blocked if
// Redis had too few. A partial grant means Redis ran dry: the key then
// waits, like a denied one, for a lease to accrue (spending what it got
// first) instead of asking again for every few tokens.
//
// A grant pays what the key owes first (see paid): a claim sent before an
// outage may land after the fallback admitted (a paused Redis runs the
// claims queued in it when the pause ends).
func (l *limiter) apply(e *entry, want, granted int64, res tierlimit.Result) {
	// Redis decided during the call: the time after it is when its
	// RetryAfter counts from, at the latest.
	now := l.now()
	l.keys.touch(e.key)
	e.remote.Store(res.Remaining)
	e.demand.Store(0)
	l.claimed(e, now)
	if granted > 0 {
		l.stats.leased.Add(granted)
		e.lastSize.Store(granted)
		if !e.evicted.Load() {
			// The grant renews the record with what the lease held when
			// the claim was sent: a lease the janitor found expired
			// (collect) spends again.
			e.expires.Store(now + int64(l.cfg.leaseTTL))
			e.expired.Store(false)
		}
		keep := granted
		if owed := e.owed.Load(); owed > 0 {
			pay := min(granted, owed)
			if e.owed.Add(-pay) <= 0 {
				e.owedSince.Store(0)
			}
			l.stats.chargedBack.Add(pay)
			keep -= pay
		}
		l.land(e, keep)
	}
	if p := e.policy(); res.Allowed && (granted >= want || p.maxLease == 1) {
		e.blockedUntil.Store(0)
	} else {
		e.blockedUntil.Store(now + int64(l.blockFor(p, res)))
	}
}

// applyGrant is apply for a claim of claimAll's: c's want, g's grant.
func (l *limiter) applyGrant(e *entry, c store.Claim, g store.Grant) {
	l.apply(e, c.Want, g.Granted, g.Result)
}

// claimed records that Redis answered a claim of e's at now: the time its
// demand is measured from (size), on the wall clock and the stall clock.
func (l *limiter) claimed(e *entry, now int64) {
	e.lastClaim.Store(now)
	e.stallClaim.Store(l.stalled.at(now))
}

// live reports whether a grant reached e less than a lease TTL ago and no
// refund of e's has been sent since (giveToRedis and collect clear
// expires). The ledger keeps its key at least leaseHold after every grant
// (its head's hi), longer than a lease, so a claim or refund of a live e
// that finds the key gone tells the script that Redis lost its state
// (store.Claim.Live).
func (l *limiter) live(e *entry) bool { return e.expires.Load() > l.now() }

// land adds n granted tokens to e's lease. Tokens that land after Close
// took the leases' tokens back (a claim that ran past Close's wait) are
// never spent: they are counted lost, not left in a lease that nobody
// refunds. Close sets final before it takes the tokens, and land reads it
// after it adds them: either Close takes them or land does.
func (l *limiter) land(e *entry, n int64) {
	e.tokens.Add(n)
	if e.evicted.Load() {
		l.keys.keep(e) // after the Add: see table.forget
	}
	if l.final.Load() {
		l.stats.lost.Add(e.tokens.Swap(0))
	}
}

// size returns how many tokens to ask for, within the lease bounds and at
// least lo: about one refill interval of the key's recent demand, and,
// while leases run dry before they expire, twice the last lease (up to half
// a lease TTL of demand), so that a key whose demand is held back by its own
// round trips still grows out of them. Half a TTL: the lease then runs low,
// and is refilled in the background, before the janitor would refund it.
//
// Demand is what callers asked for since the last claim (spend counts
// arrivals), not what was decided, over the time since the claim in which
// the limiter did not keep its callers waiting on Redis (active): a loop
// over 10,000 keys that each claim asks each key once per 10,000 round
// trips, and would otherwise size its leases for that, claim again at each
// call, and stay that slow. A key asked at least steadyAsks times per lease
// TTL gets at least a floor lease, a leaseFloorShare of the largest: its
// lease then lasts for several calls and is refilled in the background
// (spend's low) rather than claimed by a caller at each call.
func (l *limiter) size(e *entry, lo int64, now int64) int64 {
	p := e.policy()
	if until := e.blockedUntil.Load(); until != 0 && until != bar {
		// Redis ran short of the key at its last claim, and its callers'
		// demand went uncounted while it was blocked (spend): its next
		// lease is what Redis has accrued since, up to the largest.
		return max(lo, p.maxLease)
	}
	want := p.minLease
	if perNs, ok := l.demand(e, now); ok {
		want = int64(perNs*float64(l.cfg.refillInterval)) + 1
		if now-e.lastClaim.Load() < int64(l.cfg.leaseTTL) {
			ceiling := int64(perNs*float64(l.cfg.leaseTTL/2)) + 1
			want = max(want, min(2*e.lastSize.Load(), ceiling))
		}
		if steady(perNs, l.cfg.leaseTTL) {
			want = max(want, p.maxLease/leaseFloorShare)
		}
	}
	return max(lo, min(max(want, p.minLease), p.maxLease))
}

// demand returns e's key's demand since its last claim, in tokens per ns
// of the time the limiter did not keep its callers waiting (active), and
// false before its first claim.
func (l *limiter) demand(e *entry, now int64) (float64, bool) {
	last := e.lastClaim.Load()
	if last <= 0 || now <= last {
		return 0, false
	}
	return float64(e.demand.Load()) / float64(l.active(last, e.stallClaim.Load(), now)), true
}

// steady reports whether a demand of perNs tokens per ns asks at least
// steadyAsks per lease TTL.
func steady(perNs float64, ttl time.Duration) bool {
	return perNs*float64(ttl) >= steadyAsks
}

// steadyAsks and leaseFloorShare set size's floor: a key asked at least
// steadyAsks times per lease TTL leases at least 1/leaseFloorShare of the
// largest lease.
const (
	steadyAsks      = 2
	leaseFloorShare = 4
)

// blockFor is how long a denied key stays blocked: until the tokens asked
// for can have accrued, and, when leases are batched, long enough for a
// full lease to accrue (fewer Redis calls), but no longer than one refill
// interval beyond that, so that a denied caller is told at most the
// one-bucket answer plus a refill interval (G2), and never so long that
// the bucket could fill up and waste refill.
func (l *limiter) blockFor(p *policy, res tierlimit.Result) time.Duration {
	d := res.RetryAfter
	if p.maxLease > 1 {
		batch := p.limit.RefillTime(p.maxLease)
		headroom := p.limit.RefillTime(p.capacity-res.Remaining) / 2
		d = max(d, min(batch, headroom, d+l.cfg.refillInterval))
	}
	if l.cfg.lookup.Set() {
		// A blocked key claims again within a lease TTL, and so asks
		// the LimitFunc again: a plan upgrade reaches it as it reaches
		// a key with a lease (WithLimitFunc).
		d = min(d, l.cfg.leaseTTL)
	}
	return d
}

// peek answers n == 0: what the lease and Redis hold, charging nothing.
func (l *limiter) peek(ctx context.Context, key string, p *policy) (tierlimit.Result, error) {
	_, res, ev, err := l.leaseCall(ctx, "peek", key, p.claim(0, 0))
	l.report(&ev)
	switch {
	case l.bucket.Misconfigured(err):
		return tierlimit.Result{}, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err)
	case err != nil:
		res, _, err := l.fall(key, p, 0, 0)
		return res, err
	}
	return l.record(p, res, 0), nil
}
