package store

import (
	"fmt"
	"math"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Per-key limits: a key is decided under a plan, its limits by position
// (the key's own or the default at 0, the extras after) with their specs.

// plan is the limits a key is decided under. A plan never changes once
// built.
type plan struct {
	limits []tierlimit.Limit
	specs  []string // per limit: the ARGV spec (Algorithm.spec)
	maxN   int64    // the largest cost one call may ask: the smallest capacity
}

// newPlan returns the plan of limits, which are valid.
func (l *Limiter) newPlan(limits []tierlimit.Limit) *plan {
	p := &plan{limits: limits, maxN: -1}
	for _, lim := range limits {
		p.specs = append(p.specs, l.alg.spec(lim))
		if c := l.alg.capacity(lim); p.maxN < 0 || c < p.maxN {
			p.maxN = c
		}
	}
	return p
}

// check validates a key and a cost under p.
func (p *plan) check(key string, n int64) error {
	if err := check.Key(key); err != nil {
		return err
	}
	return p.checkCost(key, n)
}

// checkCost validates cost n of key under p; its error names the key, in
// the words every tier uses.
func (p *plan) checkCost(key string, n int64) error {
	if n < 0 || n > p.maxN {
		return fmt.Errorf("%w: key %q: n %d must be between 0 and %d", tierlimit.ErrInvalidCost, key, n, p.maxN)
	}
	return nil
}

// blockedPlan is the plan of a key Config.LimitFunc blocks
// (tierlimit.Blocked): no script runs for it, and any cost from 0 up is
// denied, not refused.
var blockedPlan = &plan{maxN: math.MaxInt64}

// blockedResult is the denial of every call for a key under blockedPlan.
var blockedResult = tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}

// prepare returns the plan of key, with key and n checked against it.
func (l *Limiter) prepare(key string, n int64) (*plan, error) {
	p, err := l.planOf(key)
	if err != nil {
		return nil, err
	}
	if err := p.check(key, n); err != nil {
		return nil, err
	}
	return p, nil
}

// planOf returns the plan of key: the default's, or with Config.LimitFunc
// the plan of its answer (blockedPlan for tierlimit.Blocked). A bad answer
// is an error wrapping tierlimit.ErrInvalidLimit, a failed lookup one
// wrapping tierlimit.ErrLimitLookup (Config.LimitLookup).
func (l *Limiter) planOf(key string) (*plan, error) {
	if !l.fn.Set() {
		return l.def, nil
	}
	lim, err := l.fn.Limit(key)
	if err != nil {
		return nil, err
	}
	if lim.IsBlocked() {
		return blockedPlan, nil
	}
	p, err := l.planFor(lim)
	if err != nil {
		return nil, fmt.Errorf("%w (limit of key %q)", err, key)
	}
	return p, nil
}

// planFor returns the plan whose position 0 is lim (the zero Limit: the
// default), building and caching it on first use.
func (l *Limiter) planFor(lim tierlimit.Limit) (*plan, error) {
	if lim == (tierlimit.Limit{}) || lim == l.def.limits[0] {
		return l.def, nil
	}
	return l.plans.Get(lim, func() (*plan, error) {
		if err := l.alg.check(lim); err != nil {
			return nil, err
		}
		return l.newPlan(append([]tierlimit.Limit{lim}, l.def.limits[1:]...)), nil
	})
}

// LimitFor returns the limit key is decided under at position 0:
// Config.LimitFunc's answer, or New's limit when there is none or it is the
// zero Limit; tierlimit.Blocked for a key the function blocks. Config.Extra
// applies besides. It returns an error wrapping tierlimit.ErrInvalidKey for
// a bad key and tierlimit.ErrInvalidLimit for an answer that is neither
// Blocked nor valid for the algorithm. It makes no call.
func (l *Limiter) LimitFor(key string) (tierlimit.Limit, error) {
	if err := check.Key(key); err != nil {
		return tierlimit.Limit{}, err
	}
	p, err := l.planOf(key)
	switch {
	case err != nil:
		return tierlimit.Limit{}, err
	case p == blockedPlan:
		return tierlimit.Blocked, nil
	}
	return p.limits[0], nil
}

// Check returns the error AllowN(key, n) would return for bad input: a bad
// key, a bad limit from Config.LimitFunc, or a cost outside [0, capacity].
func (l *Limiter) Check(key string, n int64) error {
	_, err := l.prepare(key, n)
	return err
}
