package hybrid

// Refills: hot leases topped up in the background before they run dry.

import (
	"context"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// refill asks a background worker to top up e's lease.
func (l *limiter) refill(e *entry) {
	if e.refillDone.Load() != nil {
		return // queued or running
	}
	done := make(chan struct{})
	if !e.refillDone.CompareAndSwap(nil, &done) {
		return
	}
	select {
	case l.refills <- e:
	default:
		l.refilled(e) // workers busy: the next spend asks again
	}
}

// refilled ends e's refill and wakes the callers waiting on it.
func (l *limiter) refilled(e *entry) {
	if done := e.refillDone.Swap(nil); done != nil {
		close(*done)
	}
}

// awaitRefill waits for a refill of e in flight, until budget fires.
func (l *limiter) awaitRefill(ctx context.Context, e *entry, budget <-chan struct{}) error {
	done := e.refillDone.Load()
	if done == nil {
		return nil
	}
	select {
	case <-*done:
	case <-budget:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// refillBatch is the most leases one background round trip refills.
const refillBatch = 256

// refiller tops up leases in the background: it takes every queued entry
// (up to refillBatch) and claims for all of them in one pipelined round trip.
func (l *limiter) refiller() {
	defer l.wg.Done()
	batch := make([]*entry, 0, refillBatch)
	for {
		select {
		case <-l.done:
			return
		case e := <-l.refills:
			batch = append(batch[:0], e)
		more:
			for len(batch) < refillBatch {
				select {
				case e := <-l.refills:
					batch = append(batch, e)
				default:
					break more
				}
			}
			l.refillAll(batch)
			for _, e := range batch {
				l.refilled(e)
			}
		}
	}
}

// refillAll claims a lease top-up for each entry still worth refilling.
func (l *limiter) refillAll(batch []*entry) {
	if l.brk.open() {
		return // the next spend asks again; no lease grows while Redis is away
	}
	now := l.now()
	var todo []*entry
	for _, e := range batch {
		if !e.evicted.Load() && !e.stale.Load() && e.blockedUntil.Load() <= now && l.reask(e, now) {
			todo = append(todo, e)
		}
	}
	l.claimAll("refill", todo,
		func(e *entry) store.Claim { return l.claimOf(e, 1, l.size(e, 1, now)) },
		func(e *entry, c store.Claim, g store.Grant) { l.apply(e, c.Want, g.Granted, g.Result) })
}

// renew claims, in the background, for the leases among entries that would
// expire before the janitor's next round while their keys are still asked
// steadily (at least steadyAsks times per lease TTL since their last
// claim): the claim extends the lease, where the janitor would refund it
// and the key's next caller would claim and wait, once per key per lease
// TTL. A lease whose key is asked rarely, or that ran dry (its key then
// claims, or a background refill did), expires. A renewal tops the lease up
// to the size its demand asks for, one token at least.
func (l *limiter) renew(entries []*entry) {
	if l.brk.open() {
		return // no lease grows while Redis is away
	}
	now := l.now()
	soon := now + int64(l.cfg.leaseTTL/4)
	var todo []*entry
	for _, e := range entries {
		if exp := e.expires.Load(); exp <= now || exp > soon || e.tokens.Load() <= 0 {
			continue
		}
		if e.policy().maxLease == 1 || e.evicted.Load() || e.stale.Load() || e.blockedUntil.Load() > now {
			continue // exact mode, dropped, forgotten, or blocked: nothing to renew
		}
		if perNs, _ := l.demand(e, now); steady(perNs, l.cfg.leaseTTL) && l.reask(e, now) {
			todo = append(todo, e)
		}
	}
	for len(todo) > 0 {
		batch := todo[:min(len(todo), refillBatch)]
		todo = todo[len(batch):]
		l.claimAll("refill", batch,
			func(e *entry) store.Claim { return l.claimOf(e, 1, max(1, l.size(e, 1, now)-e.tokens.Load())) },
			func(e *entry, c store.Claim, g store.Grant) { l.apply(e, c.Want, g.Granted, g.Result) })
	}
}

// claimAll claims what claimFor says for each entry of todo, in one
// pipelined round trip (op), holding their key locks (in order) so that no
// Reset interleaves, and hands each grant to got.
func (l *limiter) claimAll(op string, todo []*entry, claimFor func(*entry) store.Claim, got func(*entry, store.Claim, store.Grant)) {
	if len(todo) == 0 {
		return
	}
	var ev tierlimit.RedisCall
	defer l.report(&ev) // after the key locks are released
	var locks [len(l.keyLocks)]bool
	for _, e := range todo {
		locks[l.keyLockIndex(e.key)] = true
	}
	for i, used := range locks {
		if used {
			l.keyLocks[i].Lock()
			defer l.keyLocks[i].Unlock()
		}
	}
	keys := make([]string, 0, len(todo))
	claims := make([]store.Claim, 0, len(todo))
	live := todo[:0]
	for _, e := range todo {
		if e.stale.Load() { // a Reset got in before the locks
			continue
		}
		live = append(live, e)
		keys = append(keys, e.key)
		claims = append(claims, claimFor(e))
	}
	if len(live) == 0 {
		return
	}
	var grants []store.Grant
	ev, _ = l.call(op, l.cfg.callBudget, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.callBudget)
		defer cancel()
		grants = l.bucket.LeaseBatch(ctx, keys, claims)
		for _, g := range grants {
			if g.Err != nil {
				return g.Err // the round trip failed, for the breaker
			}
		}
		return nil
	})
	for i, g := range grants {
		l.replied(live[i], g.Granted, g.Err)
		if g.Err == nil {
			got(live[i], claims[i], g)
		}
	}
}
