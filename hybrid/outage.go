package hybrid

// Deciding without Redis: a claim that missed its budget, the fallback
// buckets at the instance's share while the breaker is open, and charging
// what they admitted back to Redis (debt) once it answers.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// missed decides a call of one key whose claim failed or ran past the call
// budget: see merelySlow. A lease that landed meanwhile is spent first,
// and a key known to be blocked stays blocked.
//
// The call takes between n and most tokens (see claim).
func (l *limiter) missed(ctx context.Context, key string, p *policy, n, most int64) (tierlimit.Result, int64, error) {
	if !l.merelySlow() {
		return l.fall(key, p, n, most)
	}
	if e, ok := l.lookup(key); ok {
		var res tierlimit.Result
		if got, ok := l.leased(&res, e, n, most, tierlimit.SourceRemote, tierlimit.SourceBlocked); ok {
			return res, got, nil
		}
	}
	res, err := l.slowDenial(p)
	return res, 0, err
}

// missedAll decides an AllowAll whose claim failed or ran past the call
// budget: see merelySlow.
func (l *limiter) missedAll(takes []tierlimit.Take, pols []*policy) (tierlimit.Result, error) {
	if !l.merelySlow() {
		return l.fallAll(takes, pols)
	}
	return l.slowDenial(pols[0])
}

// merelySlow reports whether a claim that failed or ran past the call budget
// leaves Redis merely slow: the breaker is closed, in FailFallback mode.
// Otherwise that is an outage, which the failure mode decides (fall). While
// Redis may only be slow no fallback bucket mints tokens for it (G1): the
// call is denied (slowDenial); the claim, if it lands, is spent by the
// next callers.
func (l *limiter) merelySlow() bool {
	return l.brk.current() == tierlimit.BreakerClosed && l.cfg.failureMode == FailFallback
}

// slowDenial denies a call under p for a budget's time, or returns the
// misconfiguration that Redis's last word was.
func (l *limiter) slowDenial(p *policy) (tierlimit.Result, error) {
	if err := l.misconfig.Load(); err != nil {
		return tierlimit.Result{}, *err
	}
	return l.record(p, p.denial(l.cfg.callBudget, tierlimit.SourceFallback), 0), nil
}

// fall decides a call of one key while Redis cannot be reached: a lease
// still held is spent first, then as fallAll. The call takes between n and
// most tokens (see claim): from the fallback bucket, n, then what else it
// holds up to most.
func (l *limiter) fall(key string, p *policy, n, most int64) (tierlimit.Result, int64, error) {
	if e, ok := l.lookup(key); ok {
		var res tierlimit.Result
		if got, ok := l.spend(&res, e, n, most, tierlimit.SourceFallback); ok {
			return res, got, nil
		}
	}
	var one [1]tierlimit.Take
	one[0] = tierlimit.Take{Key: key, N: n}
	res, err := l.fallAll(one[:], []*policy{p})
	if err != nil || !res.Allowed {
		return res, 0, err
	}
	got := n
	if more := min(most-n, res.Remaining); more > 0 { // FailOpen's Result holds 0: n alone
		one[0].N = more
		if again, err := l.fallAll(one[:], []*policy{p}); err == nil && again.Allowed {
			res, got = again, got+more
		}
	}
	return res, got, nil
}

// fallAll decides takes while Redis cannot be reached (their leases were
// tried first): unless Redis's last word was a misconfiguration, which is
// an error, the failure mode decides, and in FailFallback mode the keys'
// fallback buckets, all or nothing. A take above its key's share is
// denied, as one bucket of the share would deny it; a key whose entry the
// table could not follow is denied (see follows). The first take's policy
// is the Result's when no bucket decides.
func (l *limiter) fallAll(takes []tierlimit.Take, pols []*policy) (tierlimit.Result, error) {
	if err := l.misconfig.Load(); err != nil {
		return tierlimit.Result{}, *err
	}
	p := pols[0]
	switch l.cfg.failureMode {
	case FailOpen:
		return l.record(p, tierlimit.Result{Allowed: true, Limit: p.limit, Source: tierlimit.SourceFallback}, 0), nil
	case FailClosed:
		return l.record(p, p.denial(l.cfg.probeInterval, tierlimit.SourceFallback), 0), nil
	}
	now := time.Unix(0, l.now()) // the monotonic clock's, for the system clock
	// The buckets are locked in key order, so that AllowAlls sharing keys
	// cannot each hold one the other waits for. One key's (AllowN's) needs
	// no allocation.
	var (
		oneEntry [1]*entry
		oneTake  [1]xrate.Take
	)
	entries, fbs := oneEntry[:0], oneTake[:0]
	if len(takes) > 1 {
		entries, fbs = make([]*entry, 0, len(takes)), make([]xrate.Take, 0, len(takes))
	}
	for i, t := range takes {
		e := l.entry(t.Key, pols[i])
		if !l.follows(e) {
			return l.record(e.policy(), p.denial(l.cfg.probeInterval, tierlimit.SourceFallback), e.stripe), nil
		}
		fb := l.fallbackOf(e, now).lim
		lim := fb.Limit()
		if t.N > lim.Capacity() {
			res := fb.Decide(now, t.N) // a denial that takes nothing
			res.Source = tierlimit.SourceFallback
			return l.record(e.policy(), res, e.stripe), nil
		}
		entries = append(entries, e)
		fbs = append(fbs, xrate.Take{Bucket: fb, Limit: lim, N: t.N})
	}
	if len(takes) > 1 {
		order := make([]int, len(takes))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return strings.Compare(takes[a].Key, takes[b].Key) })
		sorted := make([]xrate.Take, len(fbs))
		for k, i := range order {
			sorted[k] = fbs[i]
		}
		fbs = sorted
	}
	res, err := xrate.DecideAll(now, fbs)
	if err != nil {
		return tierlimit.Result{}, fmt.Errorf("hybrid: %w", err)
	}
	res.Source = tierlimit.SourceFallback
	if res.Allowed {
		for i, e := range entries {
			e.owed.Add(takes[i].N)
			if e.evicted.Load() {
				l.keys.keep(e) // after the Add: see table.forget
			}
		}
	}
	if len(takes) == 1 {
		return l.record(entries[0].policy(), res, entries[0].stripe), nil
	}
	return l.record(p, res, 0), nil
}

// follows reports whether the table can follow e's debt if its fallback
// admits: e owes already, or the table follows fewer than WithMaxKeys
// dropped entries. Otherwise it cannot follow one more debt (G6), and a
// bucket forgotten at every call would admit without bound (G1): the key
// is denied, as a key known to be blocked is.
func (l *limiter) follows(e *entry) bool {
	return e.owed.Load() > 0 || l.keys.droppedLen() < l.cfg.maxKeys
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

// chargeBack debits from Redis what fallback decisions admitted in an
// outage, once the breaker has closed: a claim of up to that many tokens
// (at least none), none of which is kept, so that the bucket is charged
// for them but never goes below empty (see paid for what it lacks).
//
// The keys are charged refillBatch at a time, each batch and its marks in
// round trips of their own, as refills are: after an outage over many
// keys, one call for them all would run past the call budget on its own
// (Redis's time grows with the claims in it), the breaker would open
// again, and the fallback would go on admitting what the charge was to
// settle.
func (l *limiter) chargeBack(entries []*entry) {
	var due []*entry
	for _, e := range entries {
		if e.owed.Load() > 0 && !e.stale.Load() {
			due = append(due, e)
		}
	}
	for batch := range slices.Chunk(due, refillBatch) {
		if l.brk.current() != tierlimit.BreakerClosed {
			return
		}
		var full, short []*entry
		l.claimAll("chargeback", batch, l.debtClaim, func(e *entry, c store.Claim, g store.Grant) {
			switch l.paid(e, c.Want, g) {
			case debtFull:
				full = append(full, e)
			case debtShort:
				short = append(short, e)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.callBudget)
		l.settleMarks(ctx, full, short, false)
		cancel()
	}
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

// paid records that Redis granted granted tokens of e's debt, of the want
// its claim asked for, leaving res: they are spent, by the fallback
// decisions that owed them. What is left owed, if the claim asked for the
// whole debt (less than the capacity) and got it, was admitted while the
// claim was in flight (a claim over the budget falls back): owed as any
// debt, from its own first charge. Otherwise it is one of two things
// (docs/design.md, G4, "Charged back"):
//   - refill the bucket dropped at its cap while the fallbacks spent it
//     (or state Redis lost): one bucket would have given it. It is
//     forgiven. The bucket was full when this charge came, or when another
//     instance's charge of the same outage came: that one marked it
//     (debtFull, settleMarks), and this one finds the mark. Full in the
//     ledger's sense (store.Grant.Full): its level at its ceiling, what
//     its records hold aside, so that the claims a paused Redis held and
//     ran before any charge, whose grants their holders never received
//     or still hold, do not make it look drained.
//   - tokens other instances leased while this one fell back: the fleet
//     admitted them twice. They stay owed: the key's claims pay them
//     before they take anything (claimInto), and the janitor takes them
//     as the bucket refills, for debtWindow after the first charge;
//     what is left then is forgiven, so that an instance never starves a
//     key for long on a debt.
//
// A grant may hand over, besides the debt, what an earlier claim's lost
// reply granted (store.Claim.Received): that is the lease's, not spent.
//
// The caller holds e's key lock.
func (l *limiter) paid(e *entry, want int64, g store.Grant) debtOutcome {
	// Only fallbacks add to what e owes while the lock is held: it is at
	// least what is read here.
	pay := min(g.Granted, max(e.owed.Load(), 0))
	extra := g.Granted - pay
	if extra > 0 {
		l.stats.leased.Add(extra)
		l.land(e, extra)
	}
	l.stats.leased.Add(pay)
	l.stats.chargedBack.Add(pay)
	left := e.owed.Add(-pay)
	out := debtShort
	switch {
	case left <= 0, pay >= want && want < e.policy().capacity:
		e.owedSince.Store(0)
		out = debtSettled
	case g.Full:
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

// payDebt charges e's debt to Redis in one call, reported in ev. The caller
// holds e's key lock.
func (l *limiter) payDebt(ctx context.Context, e *entry, ev *tierlimit.RedisCall) error {
	c := l.debtClaim(e)
	g, call := l.leaseGrant(ctx, "chargeback", e.key, c)
	*ev = call
	l.replied(e, g.Granted, g.Err)
	if g.Err != nil {
		return g.Err
	}
	one := []*entry{e}
	cctx, cancel := l.budget(ctx)
	defer cancel()
	switch l.paid(e, c.Want, g) {
	case debtFull:
		l.settleMarks(cctx, one, nil, true)
	case debtShort:
		l.settleMarks(cctx, nil, one, true)
	}
	return nil
}

// shareOf returns what a key of policy p is held to while the breaker is
// open: WithFallback's limit, else p's limit divided by the live
// instances.
func (l *limiter) shareOf(p *policy) tierlimit.Limit {
	if p == l.def || l.cfg.fallback != nil {
		return *l.share.Load()
	}
	return share(p.base, l.instances.Load())
}
