package hybrid

import (
	"context"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/remote"
)

// refundBatch is the most refunds sent in one pipeline.
const refundBatch = 512

// janitor refunds expired leases every quarter of the lease TTL.
func (l *Limiter) janitor() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.leaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			_ = l.refundHeld(l.cfg.clock.Now(), false)
		}
	}
}

// refundHeld gives back the tokens of every lease expired at now (all of
// them when all is set, at Close: then even while the breaker is open, as
// it is the last chance), adds the entries' local decisions to the
// limiter's count and forgets entries that hold no tokens.
//
// An entry's tokens are taken under its key lock, with the number of its
// last claim, which the refund names: the bucket's ledger then ends the
// entry's record unless a later claim wrote it.
//
// A spend counts its decision in e.local and then, if e.held is false,
// holds e again. Here e.held is cleared before e.local is taken, so a count
// made after the take sees e.held false and puts e back: no count is left
// in an entry the janitor no longer visits.
func (l *Limiter) refundHeld(now time.Time, all bool) error {
	var due []*entry
	l.mu.Lock()
	for e := range l.held {
		if all || e.expires.Load() <= now.UnixNano() {
			due = append(due, e)
		} else {
			l.settle(e)
		}
	}
	l.mu.Unlock()
	refunds := make([]remote.Refund, 0, len(due))
	for _, e := range due {
		// A claim of e's key in flight holds its lock for as long as
		// Redis takes to answer, which in an outage can be seconds: the
		// janitor leaves e to its next round, a quarter TTL later (a
		// claim that grants extends e's lease anyway). Close cannot wait:
		// it takes the tokens with the number of the claim in flight,
		// whose grant, if it lands, is never spent.
		mu := l.keyLock(e.key)
		locked := mu.TryLock()
		if !locked && !all {
			continue
		}
		gen, t := e.gen.Load(), e.tokens.Swap(0)
		if locked {
			mu.Unlock()
		}
		if t > 0 {
			r := remote.Refund{Key: e.key, N: t, ID: l.refundID()}
			if l.cfg.ledger {
				r.Holder, r.Gen = e.holder, gen
			}
			refunds = append(refunds, r)
		}
	}
	l.mu.Lock()
	for _, e := range due {
		l.settle(e)
	}
	l.mu.Unlock()
	return l.refund(refunds, all)
}

// settle adds e's local decisions to the limiter's count and forgets e if
// it holds no tokens. The caller holds l.mu.
func (l *Limiter) settle(e *entry) {
	if e.tokens.Load() == 0 {
		e.held.Store(false)
		delete(l.held, e) // a later claim or count into e holds it again
	}
	l.localAllowed.Add(e.local.Swap(0))
}

// refund sends refunds in pipelined batches, through the breaker unless
// anyway is set; what fails is counted lost.
func (l *Limiter) refund(refunds []remote.Refund, anyway bool) error {
	send := l.call
	if anyway {
		send = l.callAnyway
	}
	var firstErr error
	for len(refunds) > 0 {
		batch := refunds[:min(len(refunds), refundBatch)]
		refunds = refunds[len(batch):]
		// A batch of 512 may take longer than one call's budget. failed is
		// the whole batch unless the call is made.
		timeout := 4*l.cfg.callBudget + time.Second
		failed := batch
		ev, err := send("refund", timeout, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var err error
			failed, err = l.bucket.Refund(ctx, batch...)
			return err
		})
		l.report(&ev)
		var sent, lost int64
		for _, r := range batch {
			sent += r.N
		}
		for _, f := range failed {
			lost += f.N
		}
		// Tokens not refunded now are lost, never retried: by the time
		// Redis answers again the bucket has refilled them anyway.
		l.stats.refunded.Add(sent - lost)
		l.stats.lost.Add(lost)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// refundID returns an ID no other refund of the fleet has: go-redis may
// send a refund twice when its connection breaks, and Redis applies one ID
// once (see remote.Refund).
func (l *Limiter) refundID() string {
	return l.id + strconv.FormatInt(l.refunds.Add(1), 36)
}

// heldTokens sums the tokens in leases.
func (l *Limiter) heldTokens() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for e := range l.held {
		n += e.tokens.Load()
	}
	return n
}
