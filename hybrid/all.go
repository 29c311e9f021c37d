package hybrid

// AllowAll: one decision over several keys, all or nothing.

import (
	"context"
	"fmt"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// AllowAll decides several takes at once, all or nothing: it admits only if
// every key admits its take, and then takes them all; a refused call takes
// from no key. Takes of one key are added up. The Result is the most
// restrictive take's: when admitted, the one with the fewest Remaining;
// when denied, the one with the longest RetryAfter. Stats counts one
// decision, and Stats.Limits counts it under the first take's limit; the
// observer's Decision carries the Result's limit (the most restrictive
// take's).
//
// The takes are spent from the keys' leases, all of them or none (a lease
// that gave its part to a call another lease then refused gets it back at
// once). Keys whose lease lacks their part claim a lease first, as AllowN
// does; a key known to be blocked denies the call without a round trip.
// While Redis cannot be reached, the failure mode decides, and in
// FailFallback mode the keys' fallback buckets decide all or nothing too.
//
// Errors are AllowN's, and tierlimit.ErrInvalidCost for no takes or more
// than tierlimit.MaxTakes keys.
func (l *Limiter) AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error) {
	start := time.Now()
	res, err := l.allowAll(ctx, takes)
	if err != nil {
		return res, named(err)
	}
	if l.onDecision != nil {
		var n int64
		for _, t := range takes {
			n += t.N
		}
		l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: res.Source, N: n, Latency: time.Since(start), Limit: res.Limit})
	}
	return res, nil
}

func (l *limiter) allowAll(ctx context.Context, takes []tierlimit.Take) (tierlimit.Result, error) {
	takes, err := check.Takes(takes)
	if err != nil {
		return tierlimit.Result{}, fmt.Errorf("hybrid: %w", err)
	}
	pols := make([]*policy, len(takes))
	for i, t := range takes {
		if err := l.check(ctx, t.Key, t.N); err != nil {
			return tierlimit.Result{}, err
		}
		if pols[i], err = l.checkPolicy(t.Key, t.N); err != nil {
			return tierlimit.Result{}, err
		}
	}
	for _, p := range pols {
		if p.blocked { // a barred key denies the whole call
			return l.record(p, barred(), 0), nil
		}
	}
	entries := make([]*entry, len(takes))
	expiry, stop := l.expiry()
	defer stop()
	// A lease claimed for one take may be spent by other callers before
	// the others are: try again, a bounded number of times.
	for attempt := 0; attempt < 4; attempt++ {
		for i, t := range takes {
			entries[i], _ = l.lookup(t.Key)
		}
		if res, ok := l.spendAll(entries, takes); ok {
			return l.record(pols[0], res, entries[0].stripe), nil
		}
		if res, ok := l.blockedAny(entries, takes); ok {
			return l.record(pols[0], res, 0), nil
		}
		if l.brk.open() {
			return l.fallAll(takes, pols)
		}
		for i, t := range takes {
			if e := entries[i]; e != nil && e.spendable() >= t.N {
				continue
			}
			h := keyHash(t.Key)
			if !l.keys.enter(h) {
				return tierlimit.Result{}, tierlimit.ErrClosed
			}
			e, err := l.shared(ctx, t.Key, h, pols[i], t.N, t.N, expiry)
			l.keys.exit(h)
			switch {
			case err == errMissed:
				return l.missedAll(takes, pols)
			case err != nil:
				return tierlimit.Result{}, err
			}
			var res tierlimit.Result
			if l.blocked(&res, e, t.N, tierlimit.SourceRemote) {
				return l.record(pols[0], res, 0), nil
			}
		}
		if err := ctx.Err(); err != nil {
			return tierlimit.Result{}, err
		}
	}
	return l.record(pols[0], pols[0].denial(pols[0].limit.RefillTime(1), tierlimit.SourceRemote), 0), nil
}

// spendAll takes every take from its entry's lease, or none: a lease that
// lacks its part gives the parts taken before it back.
func (l *limiter) spendAll(entries []*entry, takes []tierlimit.Take) (tierlimit.Result, bool) {
	for i, t := range takes {
		ok := entries[i] != nil
		if ok {
			_, _, ok = entries[i].take(t.N, t.N)
		}
		if !ok {
			for j := range i {
				entries[j].tokens.Add(takes[j].N)
			}
			return tierlimit.Result{}, false
		}
	}
	res := tierlimit.Result{Allowed: true, Remaining: -1, Source: tierlimit.SourceLocal}
	for i, t := range takes {
		e := entries[i]
		left := e.tokens.Load()
		l.spent(e, t.N, left)
		p := e.policy()
		if r := min(left+e.remote.Load(), p.capacity); res.Remaining < 0 || r < res.Remaining {
			res.Remaining, res.Limit = r, p.limit
			res.ResetAfter = p.limit.RefillTime(p.capacity - r)
		}
	}
	return res, true
}

// blockedAny returns a denial when a take's key is known to be blocked for
// it: the longest wait among them.
func (l *limiter) blockedAny(entries []*entry, takes []tierlimit.Take) (tierlimit.Result, bool) {
	var worst tierlimit.Result
	found := false
	for i, t := range takes {
		if entries[i] == nil {
			continue
		}
		var res tierlimit.Result
		if l.blocked(&res, entries[i], t.N, tierlimit.SourceBlocked) && (!found || res.RetryAfter > worst.RetryAfter) {
			worst, found = res, true
		}
	}
	return worst, found
}
