package hybrid

// Refunds: the janitor, which takes expired leases back to Redis, and
// Close's last refunds.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit/internal/store"
)

// refundBatch is the most refunds sent in one pipeline.
const refundBatch = 512

// janitor sweeps every quarter of the lease TTL.
func (l *limiter) janitor() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.leaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			l.sweep()
		}
	}
}

// sweep is the janitor's round: it renews the leases of steady keys that
// would expire before the next round, refunds the expired ones, and
// charges Redis what fallbacks admitted.
func (l *limiter) sweep() {
	entries := l.keys.holding()
	l.renew(entries)
	_ = l.refund(l.collect(time.Unix(0, l.now()), false, entries), false)
	l.chargeBack(entries)
}

// refundHeld gives back the tokens of every lease expired at now (all of
// them when all is set), as refund does for the entries that hold tokens.
func (l *limiter) refundHeld(now time.Time, all bool) error {
	return l.refund(l.collect(now, all, l.keys.holding()), all)
}

// collect takes back the tokens of the leases of entries expired at now
// (all of them when all is set, at Close) and returns their refunds; it
// stops following the dropped entries that hold no tokens.
//
// An entry's tokens are taken under its key lock, and the refund numbered
// after its last claim (store.Refund.Gen): the bucket's ledger then ends
// the entry's record unless a later claim ran first.
func (l *limiter) collect(now time.Time, all bool, entries []*entry) []store.Refund {
	refunds := make([]store.Refund, 0, len(entries))
	for _, e := range entries {
		if !all && e.expires.Load() > now.UnixNano() {
			continue
		}
		// A claim of e's key in flight holds its lock for as long as
		// Redis takes to answer, which in an outage can be seconds: the
		// janitor leaves e to its next round, a quarter TTL later (a
		// claim that grants extends e's lease anyway). Close cannot wait:
		// it takes the tokens with a number after the claim in flight,
		// whose grant, if it lands, is never spent.
		mu := l.keyLock(e.key)
		locked := mu.TryLock()
		if !locked && !all {
			continue
		}
		t := e.tokens.Swap(0)
		// A claim whose reply never came may have run: what it granted,
		// recorded in the ledger, goes back too (store.Refund.Received).
		lost := e.lost.Swap(false)
		if t > 0 || lost {
			r := e.policy().refund(e.key, t, l.refundID())
			r.Holder, r.Gen, r.Received, r.Live = e.holder, e.gen.Add(1), e.received.Load(), l.live(e)
			refunds = append(refunds, r)
		}
		if locked {
			mu.Unlock()
		}
		if e.evicted.Load() {
			l.forget(e)
		}
	}
	return refunds
}

// refund sends refunds (see send), through the breaker unless anyway is
// set, and counts their tokens refunded or lost.
func (l *limiter) refund(refunds []store.Refund, anyway bool) error {
	sent, lost, err := l.sendRefunds(refunds, anyway)
	l.stats.refunded.Add(sent - lost)
	l.stats.lost.Add(lost)
	return err
}

// refundLast sends Close's refunds, even while the breaker holds calls
// back (they are the last chance), and waits for them at most
// closeRefund: their tokens are counted lost then, and moved to refunded
// if their call succeeds later.
func (l *limiter) refundLast(refunds []store.Refund) error {
	var (
		mu          sync.Mutex
		late, ended bool // Close gave up on the refunds; they ended
		sent, lost  int64
		err         error
		outstanding int64
	)
	for _, r := range refunds {
		outstanding += r.N + r.Spent
	}
	detach(context.Background(), closeRefund, func() {
		s, f, e := l.sendRefunds(refunds, true)
		mu.Lock()
		defer mu.Unlock()
		sent, lost, err, ended = s, f, e, true
		if late {
			// Counted lost when Close gave up on them.
			l.stats.lost.Add(-(s - f))
			l.stats.refunded.Add(s - f)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if !ended {
		late = true
		l.stats.lost.Add(outstanding)
		return fmt.Errorf("hybrid: close: %d tokens not refunded within %v: %w", outstanding, closeRefund, context.DeadlineExceeded)
	}
	l.stats.refunded.Add(sent - lost)
	l.stats.lost.Add(lost)
	return err
}

// sendRefunds sends refunds in pipelined batches, through the breaker
// unless anyway is set, and returns the tokens sent and those of the
// refunds that failed.
func (l *limiter) sendRefunds(refunds []store.Refund, anyway bool) (sent, lost int64, err error) {
	send := l.call
	if anyway {
		send = l.callAnyway
	}
	for len(refunds) > 0 {
		batch := refunds[:min(len(refunds), refundBatch)]
		refunds = refunds[len(batch):]
		// A batch of 512 may take longer than one call's budget. failed is
		// the whole batch unless the call is made.
		timeout := 4*l.cfg.callBudget + time.Second
		failed := batch
		ev, callErr := send("refund", timeout, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var err error
			failed, err = l.bucket.Refund(ctx, batch...)
			return err
		})
		l.report(&ev)
		for _, r := range batch {
			sent += r.N + r.Spent
		}
		// Tokens not refunded now are lost, never retried: by the time
		// Redis answers again the bucket has refilled them anyway.
		for _, f := range failed {
			lost += f.N + f.Spent
		}
		if callErr != nil && err == nil {
			err = callErr
		}
	}
	return sent, lost, err
}

// refundID returns an ID no other refund of the fleet has: go-redis may
// send a refund twice when its connection breaks, and Redis applies one ID
// once (see store.Refund).
func (l *limiter) refundID() string {
	return l.id + strconv.FormatInt(l.refunds.Add(1), 36)
}

// heldTokens sums the tokens in leases.
func (l *limiter) heldTokens() int64 {
	var n int64
	for _, e := range l.keys.holding() {
		n += e.tokens.Load()
	}
	return n
}
