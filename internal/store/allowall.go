package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// errLedger is returned by AllowAll, Settle and AllowAtMost of a Limiter
// with a lease ledger (Config.Hold): its script decides one key at a time,
// by claims.
var errLedger = fmt.Errorf("%w: AllowAll, Settle and AllowAtMost are not for a lease ledger", tierlimit.ErrInvalidOption)

// group is the takes of one call: keys of one Cluster slot (every key, on
// a single Redis).
type group struct {
	slot   int
	takes  []tierlimit.Take
	plans  []*plan
	keys   []string          // KEYS: per take, the keys of its limits
	limits []tierlimit.Limit // per entry: a take's key under one limit
}

// add adds take t under p to g.
func (g *group) add(l *Limiter, t tierlimit.Take, p *plan) {
	g.takes = append(g.takes, t)
	g.plans = append(g.plans, p)
	g.keys = l.appendKeys(g.keys, t.Key)
	g.limits = append(g.limits, p.limits...)
}

// args returns the ARGV of g in mode, each entry's cost its take's N times
// sign.
func (g *group) args(l *Limiter, mode string, sign int64) []any {
	args := l.head(mode, len(g.limits))
	for i, t := range g.takes {
		for _, spec := range g.plans[i].specs {
			args = append(args, sign*t.N, spec)
		}
	}
	return args
}

// AllowAll decides takes all-or-nothing: each take's key is charged its N
// under each of the key's limits (its own, or the default, and the
// extras) only if every one admits it; a refused call charges no key.
// The Result is the most restrictive entry's: on admission the smallest
// Remaining, on denial the largest RetryAfter of the call that refused.
// It returns an error wrapping tierlimit.ErrInvalidKey or ErrInvalidCost
// (check.Takes, or a take above its key's capacity) before any
// call. A take of a key Config.LimitFunc blocks denies the call
// (blockedResult) without any call: no key is charged.
//
// Keys in one Redis Cluster slot, and all keys on a single Redis, are
// decided in one script call, atomically. Keys in several slots are
// decided slot by slot, in the order of their slots; when a later slot's
// call refuses, AllowAll gives back, before it returns, what the earlier
// ones charged (the scripts' settle mode: capped at capacity, so a refill
// meanwhile is not given twice). Other callers may see those charges
// until then. If Redis fails on a give-back, the error says which keys
// were left charged and by how much.
func (l *Limiter) AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error) {
	if l.alg.ledger {
		return tierlimit.Result{}, errLedger
	}
	var start time.Time // read only when observed
	if l.onDecision != nil {
		start = time.Now()
	}
	groups, total, err := l.groups(takes)
	if err != nil {
		return tierlimit.Result{}, err
	}
	res := tierlimit.Result{Allowed: true, Source: tierlimit.SourceRemote, Remaining: -1}
	if groups == nil {
		res = blockedResult
	}
	for i, g := range groups {
		r, err := l.runGroup(ctx, "allow", g, g.args(l, modeDecide, 1))
		if err == nil && r.Allowed {
			res = fold(res, r)
			continue
		}
		if undoErr := l.undo(ctx, groups[:i]); undoErr != nil {
			err = errors.Join(err, undoErr)
		}
		if err != nil {
			return tierlimit.Result{}, err
		}
		res = r
		break
	}
	if l.onDecision != nil {
		l.reportDecision(res, total, time.Since(start))
	}
	return res, nil
}

// fold adds the admitting Result r of one group to res.
func fold(res, r tierlimit.Result) tierlimit.Result {
	if res.Remaining < 0 || r.Remaining < res.Remaining {
		res.Remaining, res.Limit = r.Remaining, r.Limit
	}
	res.ResetAfter = max(res.ResetAfter, r.ResetAfter)
	return res
}

// groups checks takes and returns them in groups of one call each, in
// slot order, and the sum of their costs. It returns no groups (and no
// error) when a take's key is blocked (blockedPlan): no call is to be made.
func (l *Limiter) groups(takes []tierlimit.Take) ([]*group, int64, error) {
	merged, err := check.Takes(takes)
	if err != nil {
		return nil, 0, err
	}
	var groups []*group
	var total int64
	isBlocked := false
	for _, t := range merged {
		p, err := l.planOf(t.Key)
		if err != nil {
			return nil, 0, err
		}
		if err := p.checkCost(t.Key, t.N); err != nil {
			return nil, 0, err
		}
		total += min(t.N, (1<<62)-total) // a sum for the observer only
		if p == blockedPlan {
			isBlocked = true
		}
		if isBlocked {
			continue
		}
		slot := 0
		if l.cluster {
			tag := keyTag(t.Key)
			slot = slotOf(string(tag[:]))
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.slot == slot })
		if i < 0 {
			i = len(groups)
			groups = append(groups, &group{slot: slot})
		}
		groups[i].add(l, t, p)
	}
	if isBlocked {
		return nil, total, nil
	}
	slices.SortFunc(groups, func(a, b *group) int { return a.slot - b.slot })
	return groups, total, nil
}

// runGroup runs one call of g with ARGV args, reported to the observer as
// op.
func (l *Limiter) runGroup(ctx context.Context, op string, g *group, args []any) (tierlimit.Result, error) {
	start := l.start()
	res, _, err := l.run(ctx, g.keys, args, g.limits)
	l.reportCall(op, start, err)
	return res, err
}

// undo gives back what the admitted groups charged, each in one call. It
// returns an error naming what it left charged.
func (l *Limiter) undo(ctx context.Context, groups []*group) error {
	var left []string
	var errs []error
	for _, g := range groups {
		if _, err := l.runGroup(ctx, "settle", g, g.args(l, modeSettle, -1)); err != nil {
			errs = append(errs, err)
			for _, t := range g.takes {
				left = append(left, fmt.Sprintf("%q by %d", t.Key, t.N))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("AllowAll refused, and giving back its charges failed, leaving charged %s: %w",
		strings.Join(left, ", "), errors.Join(errs...))
}

// Settle corrects a charge of key after the fact: the key was charged
// charged and really used used. The difference is given back (charged >
// used; up to full at most) or taken (used > charged; never denied) under
// each of the key's limits, in one round trip: the token bucket and GCRA
// take it into debt below empty, down to minus the capacity, which their
// refill repays before the key is admitted again; the window algorithms
// keep no debt (a count stays within [0, rate]). What a limit could not
// take (its floor, or its full window) is the Result's Uncharged, the
// most of any limit. charged must be between 0 and the key's capacity,
// used at least 0 (ErrInvalidCost). The
// Result is Allowed, with Remaining after the correction; for a key
// Config.LimitFunc blocks, Settle changes nothing and returns
// blockedResult (not Allowed).
func (l *Limiter) Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error) {
	if l.alg.ledger {
		return tierlimit.Result{}, errLedger
	}
	p, err := l.prepare(key, charged)
	if err != nil {
		return tierlimit.Result{}, err
	}
	if used < 0 {
		return tierlimit.Result{}, fmt.Errorf("%w: used %d must be >= 0", tierlimit.ErrInvalidCost, used)
	}
	if p == blockedPlan {
		return blockedResult, nil
	}
	// No limit can take more than twice its capacity (from full to the
	// floor): the scripts get at most that, which keeps their arithmetic
	// exact, and what they could not have taken anyway is uncharged.
	d, most := used-charged, int64(0)
	for _, lim := range p.limits {
		most = max(most, 2*l.alg.capacity(lim))
	}
	sent := min(d, most)
	start := l.start()
	res, uncharged, err := l.run(ctx, l.Keys(key), l.args(modeSettle, p, sent), p.limits)
	l.reportCall("settle", start, err)
	if err == nil && d > 0 {
		res.Uncharged = uncharged + d - sent
	}
	if err == nil && used == 0 && charged > 0 && l.onGiveBack != nil {
		l.onGiveBack(tierlimit.GiveBack{Source: tierlimit.SourceRemote, N: charged, Limit: p.limits[0]})
	}
	return res, err
}

// AllowAtMost grants key between 1 and n tokens, as many as each of its
// limits holds whole (the least of them), charged to every limit, in one
// round trip; or, when a limit holds less than one, none, with a denial
// whose RetryAfter is the largest exact wait for one. n is from 1 to
// tierlimit.MaxRate, above the key's capacity too (ErrInvalidCost
// otherwise, after the key's ErrInvalidKey). A key Config.LimitFunc blocks
// is granted 0 with blockedResult, without a call. The observer sees the
// call as "allow", and a Decision of N = granted, or n when denied.
func (l *Limiter) AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error) {
	if l.alg.ledger {
		return 0, tierlimit.Result{}, errLedger
	}
	var start time.Time // read only when observed
	if l.observed() {
		start = time.Now()
	}
	if err := check.Key(key); err != nil {
		return 0, tierlimit.Result{}, err
	}
	if err := check.AtMost(n); err != nil {
		return 0, tierlimit.Result{}, fmt.Errorf("%w (key %q)", err, key)
	}
	p, err := l.planOf(key)
	if err != nil {
		return 0, tierlimit.Result{}, err
	}
	if p == blockedPlan {
		if l.onDecision != nil {
			l.reportDecision(blockedResult, n, time.Since(start))
		}
		return 0, blockedResult, nil
	}
	res, granted, err := l.run(ctx, l.Keys(key), l.args(modePartial, p, n), p.limits)
	if !l.observed() {
		return granted, res, err
	}
	lat := time.Since(start)
	if l.onCall != nil {
		l.onCall(tierlimit.RedisCall{Op: "allow", Latency: lat, Err: err})
	}
	if err != nil {
		return 0, res, err
	}
	if res.Allowed {
		n = granted
	}
	l.reportDecision(res, n, lat)
	return granted, res, nil
}
