package hybrid

// Refills: hot leases topped up in the background before they run dry.

import (
	"context"
	"slices"
	"sync"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// refill asks a background worker to top up e's lease. Each entry is
// queued at most once at a time (refillDone), so the queue holds at most
// one item per key and no request is dropped: a dropped request would be
// asked again by the key's next spend, and on many keys whose leases run
// low together, those requests (a channel made each) cost more than the
// decisions (a probe of 10,000 keys in turn: 197,000 of 200,000 requests
// of a round dropped by a queue of 1,024, and the keys then claimed on
// their callers' path).
func (l *limiter) refill(e *entry) {
	if e.refillDone.Load() != nil {
		return // queued or running
	}
	done := make(chan struct{})
	if !e.refillDone.CompareAndSwap(nil, &done) {
		return
	}
	l.queues[l.queueOf(e)].push(e)
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

// refillBatch is the most claims one background round trip makes
// (refills, renewals, charge-backs). Redis runs them in one script call,
// during which it answers no other caller: the call must end well within
// the call budget, or the breaker takes Redis for stalled. The refillers'
// batches may be in Redis at once: a call may wait behind
// refillers·refillBatch = 256 claims.
const refillBatch = 128

// refillers is the number of background refill workers, each with its own
// queue and its own share of the key locks (queueOf), so that their round
// trips overlap: a refill batch holds the key locks of its keys while it
// waits for Redis (claimAll), and a batch of 256 keys drawn at random holds
// most of the 256 locks, so that workers sharing the locks ran one batch at
// a time, Redis idle while the client encoded and decoded them
// (bench/RESULTS.md, issue 28).
const refillers = 2

// queueOf returns the index of e's refill queue: its key lock's, modulo
// refillers, so that the keys of one worker's batches never share a lock
// with another's.
func (l *limiter) queueOf(e *entry) int { return l.keyLockIndex(e.key) % refillers }

// refillQueue is the entries waiting for a background refill. It is safe
// for concurrent use.
type refillQueue struct {
	mu      sync.Mutex
	waiting []*entry
	wake    chan struct{} // holds a token while waiting may be non-empty: its worker drains it then
}

func newRefillQueue() *refillQueue { return &refillQueue{wake: make(chan struct{}, 1)} }

// push queues e and wakes the queue's worker.
func (q *refillQueue) push(e *entry) {
	q.mu.Lock()
	q.waiting = append(q.waiting, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop moves up to refillBatch queued entries to batch and returns it.
func (q *refillQueue) pop(batch []*entry) []*entry {
	q.mu.Lock()
	n := min(len(q.waiting), refillBatch)
	batch = append(batch[:0], q.waiting[:n]...)
	rest := copy(q.waiting, q.waiting[n:])
	clear(q.waiting[rest:])
	q.waiting = q.waiting[:rest]
	q.mu.Unlock()
	return batch
}

// refiller tops up leases in the background: it takes queued entries (up
// to refillBatch) and claims for all of them in one pipelined round trip,
// until the queue is empty. When the limiter closes it ends the refills
// still queued (their waiters decide on without them).
func (l *limiter) refiller(q *refillQueue) {
	defer l.wg.Done()
	var batch []*entry
	for {
		select {
		case <-l.done:
			l.drain(q, batch, false)
			return
		case <-q.wake:
			batch = l.drain(q, batch, true)
		}
	}
}

// drain takes the queued entries, refillBatch at a time, until none is
// left, refills them if claim is set, and ends their refills. It returns
// batch's buffer for the next drain.
func (l *limiter) drain(q *refillQueue, batch []*entry, claim bool) []*entry {
	for batch = q.pop(batch); len(batch) > 0; batch = q.pop(batch) {
		if claim {
			l.refillAll(batch)
		}
		for _, e := range batch {
			l.refilled(e)
		}
	}
	return batch
}

// refillAll claims a lease top-up for each entry still worth refilling.
func (l *limiter) refillAll(batch []*entry) {
	if l.brk.open() {
		return // the next spend asks again; no lease grows while Redis is away
	}
	now := l.now()
	var todo []*entry
	for _, e := range batch {
		if !e.evicted.Load() && !e.stale.Load() && e.blockedUntil.Load() <= now+l.preclaim(e) && l.reask(e, now) {
			todo = append(todo, e)
		}
	}
	l.claimAll("refill", todo,
		func(e *entry) store.Claim { return l.claimOf(e, 1, l.size(e, 1, now)) },
		l.applyGrant)
}

// preclaim is how long before e's block ends its denials ask for its next
// lease in the background (blocked): about as long as a call to Redis
// takes to be answered (srtt plus four variations), or an eighth of the
// block if that is longer, at most half a refill interval. A key asked
// less often than once per round trip would otherwise find its block
// ended and wait for the claim itself (a Zipf draw over 10,000 keys: 440
// to 1,000 of 2,000,000 decisions did, on keys asked about once per
// 300 µs); a claim sent an eighth of the block early finds at most an
// eighth fewer tokens accrued.
func (l *limiter) preclaim(e *entry) int64 {
	block := e.blockedUntil.Load() - e.lastClaim.Load()
	return min(max(l.rtt.rto.Load(), block/8), int64(l.cfg.refillInterval/2))
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
	for batch := range slices.Chunk(todo, refillBatch) {
		l.claimAll("refill", batch,
			func(e *entry) store.Claim { return l.claimOf(e, 1, max(1, l.size(e, 1, now)-e.tokens.Load())) },
			l.applyGrant)
	}
}

// claimAll claims what claimFor says for each entry of todo (at most
// refillBatch of them), in one round trip (op), holding their key locks
// (in order) so that no Reset interleaves, and hands each grant to got.
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
