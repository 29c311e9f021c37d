package hybrid

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// refundBatch is the most refunds sent in one pipeline.
const refundBatch = 512

// janitor refunds expired leases every quarter of the lease TTL.
func (l *limiter) janitor() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.leaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			entries := l.keys.holding()
			_ = l.refund(l.collect(time.Unix(0, l.now()), false, entries), false)
			l.chargeBack(entries)
		}
	}
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

// chargeBack debits from Redis what fallback decisions admitted in an
// outage, once the breaker has closed: a claim of up to that many tokens
// (at least none), none of which is kept, so that the bucket is charged
// for them but never goes below empty (see paid for what it lacks).
func (l *limiter) chargeBack(entries []*entry) {
	if l.brk.current() != tierlimit.BreakerClosed {
		return
	}
	var due, full, short []*entry
	for _, e := range entries {
		if e.owed.Load() > 0 && !e.stale.Load() {
			due = append(due, e)
		}
	}
	l.claimAll("chargeback", due, l.debtClaim, func(e *entry, _ store.Claim, g store.Grant) {
		switch l.paid(e, g.Granted, g.Result) {
		case debtFull:
			full = append(full, e)
		case debtShort:
			short = append(short, e)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.callBudget)
	defer cancel()
	l.settleMarks(ctx, full, short, false)
}

// debtClaim is the claim that charges e's debt: up to what it owes, at
// least nothing. The caller holds e's key lock.
func (l *limiter) debtClaim(e *entry) store.Claim {
	return l.claimOf(e, 0, min(e.owed.Load(), e.policy().capacity))
}

// debtOutcome is what a charge of a debt leaves to do.
type debtOutcome int

const (
	debtSettled debtOutcome = iota // paid, or forgiven
	debtFull                       // forgiven, the bucket being full: mark it for the other instances
	debtShort                      // owed still: forgiven if the bucket was marked full
)

// paid records that Redis granted granted tokens of e's debt, leaving res:
// they are spent, by the fallback decisions that owed them. What is left
// owed is one of two things (docs/design.md, G4, "Charged back"):
//   - refill the bucket dropped at its cap while the fallbacks spent it
//     (or state Redis lost): one bucket would have given it. It is
//     forgiven. The bucket was full when this charge came, or when another
//     instance's charge of the same outage came: that one marked it
//     (debtFull, settleMarks), and this one finds the mark.
//   - tokens other instances leased while this one fell back: the fleet
//     admitted them twice. They stay owed: the key's claims pay them
//     before they take anything (claimInto), and the janitor takes them
//     as the bucket refills, for debtWindow after the first charge;
//     what is left then is forgiven, so that an instance never starves a
//     key for long on a debt.
//
// The caller holds e's key lock.
func (l *limiter) paid(e *entry, granted int64, res tierlimit.Result) debtOutcome {
	l.stats.leased.Add(granted)
	l.stats.chargedBack.Add(granted)
	left := e.owed.Add(-granted)
	out := debtShort
	switch {
	case left <= 0:
		e.owedSince.Store(0)
		out = debtSettled
	case granted+res.Remaining >= e.policy().capacity:
		l.forgive(e)
		out = debtFull
	case e.owedSince.Load() == 0:
		e.owedSince.Store(l.now())
	case l.now()-e.owedSince.Load() >= int64(l.debtWindow()):
		l.forgive(e)
		out = debtSettled
	}
	if e.evicted.Load() {
		l.forget(e)
	}
	return out
}

// debtWindow is how long a debt the bucket could not pay at once stays
// owed: one lease TTL, at most a second. A pause (CLIENT PAUSE, SIGSTOP)
// leaves debts that one bucket would not charge (see docs/design.md, G4),
// and carrying them costs the key their window's refill
// (TestOutageKeepingState).
func (l *limiter) debtWindow() time.Duration { return min(l.cfg.leaseTTL, time.Second) }

// forgive drops what e owes. The caller holds e's key lock.
func (l *limiter) forgive(e *entry) {
	e.owed.Add(-max(0, e.owed.Load()))
	e.owedSince.Store(0)
}

// markTTL is how long a bucket found full stays marked: long enough for
// every instance to charge its debt of the same outage (its breaker closes
// within a probe interval of Redis answering, its janitor runs every
// quarter lease TTL).
func (l *limiter) markTTL() time.Duration { return 2*l.cfg.leaseTTL + l.cfg.probeInterval }

// settleMarks marks the buckets of full, found full by a charge, and
// forgives the debts of short whose buckets another instance marked. With
// locked, the caller holds the key lock of short's one entry.
func (l *limiter) settleMarks(ctx context.Context, full, short []*entry, locked bool) {
	keys := func(es []*entry) []string {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = e.key
		}
		return out
	}
	if len(full) > 0 {
		// Even while the breaker holds calls back: a claim sent before
		// an outage can land before it closes, and its answer is the
		// one that saw the bucket full.
		ev, _ := l.callAnyway("mark", l.cfg.callBudget, func() error {
			return l.bucket.Mark(ctx, l.markTTL(), keys(full)...)
		})
		l.report(&ev)
	}
	if len(short) == 0 {
		return
	}
	var marked []bool
	ev, err := l.call("mark", l.cfg.callBudget, func() error {
		var err error
		marked, err = l.bucket.Marked(ctx, keys(short)...)
		return err
	})
	l.report(&ev)
	if err != nil {
		return
	}
	for i, e := range short {
		if !marked[i] {
			continue
		}
		if locked {
			l.forgive(e)
			continue
		}
		mu := l.keyLock(e.key)
		mu.Lock()
		l.forgive(e)
		mu.Unlock()
	}
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
