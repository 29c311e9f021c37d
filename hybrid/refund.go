package hybrid

// Refunds: the janitor, which takes expired leases back to Redis, and
// Close's last refunds.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
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
	l.settleDoubts()
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
			// Its tokens stop here all the same: spent past the TTL
			// and the quarter TTL the janitor may be late, they could
			// outlive their ledger record (leaseHold). A grant of the
			// claim in flight renews the lease (apply), so the flag is
			// cleared again if one landed meanwhile.
			e.expired.Store(true)
			if e.expires.Load() > now.UnixNano() {
				e.expired.Store(false)
			}
			continue
		}
		t := e.tokens.Swap(0)
		// A claim whose reply never came may have run: what it granted,
		// recorded in the ledger, goes back too (store.Refund.Received).
		lost := e.lost.Swap(false)
		if t > 0 || lost {
			r := e.policy().refund(e.key, t, l.refundID())
			r.Holder, r.Gen, r.Received, r.Live = e.holder, e.gen.Add(1), e.received.Load(), l.live(e)
			e.covered.Store(0) // the refund ends e's record
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
	within(context.Background(), closeRefund, func() {
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
		if outstanding == 0 {
			// Only records in doubt (claims whose replies never came):
			// no token of this instance's is at stake, and the ledger
			// frees them at their deadlines if the refunds never run.
			return nil
		}
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
		// A batch of 512 may take longer than one call's budget. Every
		// refund of the batch failed unless the call is made (outs).
		timeout := 4*l.cfg.callBudget + time.Second
		var outs []store.RefundOutcome
		ev, callErr := send("refund", timeout, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var err error
			outs, err = l.bucket.RefundEach(ctx, batch...)
			return err
		})
		l.report(&ev)
		// Tokens not refunded now are lost, never sent again: by the time
		// Redis answers again the bucket has refilled them anyway. A
		// refund whose call got no reply may have run, though: its marker
		// tells the janitor later (settleDoubts).
		for i, r := range batch {
			sent += r.N + r.Spent
			switch {
			case outs == nil:
				lost += r.N + r.Spent
			case outs[i].Err != nil:
				lost += r.N + r.Spent
				if r.ID != "" && !answered(outs[i].Err) {
					l.doubts.add(r, l.now())
				}
			case outs[i].Took < r.N:
				// The holder's record had ended: the rest stays debited
				// until the bucket refills it.
				lost += r.N - outs[i].Took
			}
		}
		if callErr != nil && err == nil {
			err = callErr
		}
	}
	return sent, lost, err
}

// doubts are refunds counted lost whose calls got no reply: Redis may have
// run them all the same (a call past the client's timeout to a paused
// server runs when the pause ends), and Stats.Lost would then count tokens
// that went back. At most maxDoubts are kept, each until Redis says whether
// it ran or its marker would have expired. It is safe for concurrent use.
type doubts struct {
	mu   sync.Mutex
	list []doubt
}

// doubt is a refund counted lost, and when it was sent (ns).
type doubt struct {
	r    store.Refund
	sent int64
}

// maxDoubts bounds the refunds kept in doubt: past it, more stay counted
// lost.
const maxDoubts = 4096

// add keeps r, sent at now, in doubt.
func (d *doubts) add(r store.Refund, now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.list) < maxDoubts {
		d.list = append(d.list, doubt{r, now})
	}
}

// take removes and returns up to n refunds in doubt.
func (d *doubts) take(n int) []doubt {
	d.mu.Lock()
	defer d.mu.Unlock()
	n = min(n, len(d.list))
	out := slices.Clone(d.list[:n])
	d.list = slices.Delete(d.list, 0, n)
	return out
}

// settleDoubts asks Redis, unless the breaker is open, whether the refunds
// in doubt ran: the tokens of those that did move from Stats.Lost to
// Stats.Refunded; those that did not are asked about again at the next
// round, until their markers would have expired (a refund queued in a
// paused Redis runs when it resumes, which may be after this round). The
// question, a read, may be the half-open breaker's probe.
func (l *limiter) settleDoubts() {
	if l.brk.current() == tierlimit.BreakerOpen {
		return
	}
	ds := l.doubts.take(refundBatch)
	if len(ds) == 0 {
		return
	}
	refunds := make([]store.Refund, len(ds))
	for i, d := range ds {
		refunds[i] = d.r
	}
	var took []int64
	ev, err := l.call("refund", l.cfg.callBudget, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.callBudget)
		defer cancel()
		var err error
		took, err = l.bucket.Applied(ctx, refunds...)
		return err
	})
	l.report(&ev)
	now := l.now()
	for i, d := range ds {
		switch {
		case err == nil && took[i] >= 0:
			back := took[i] + d.r.Spent
			l.stats.lost.Add(-back)
			l.stats.refunded.Add(back)
		case now-d.sent < int64(store.MarkerTTL): // else it can no longer be asked about
			l.doubts.add(d.r, d.sent)
		}
	}
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
