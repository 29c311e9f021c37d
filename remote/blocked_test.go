package remote

import (
	"context"
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestBlocked: on every algorithm, a key the LimitFunc blocks is denied by
// every call, peeks included, with the blocked Result and without a call
// to Redis (no key of it is written): a refused AllowAll charges its other
// key nothing, WaitN returns at once with ErrWaitDeadline, Settle changes
// nothing, the observer counts the denials as blocked, and LimitFor says
// Blocked.
func TestBlocked(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			b := miniBackend(t)
			b.set(t0)
			var mu sync.Mutex
			var decisions []tierlimit.Decision
			obs := &tierlimit.Observer{Decision: func(d tierlimit.Decision) {
				mu.Lock()
				defer mu.Unlock()
				decisions = append(decisions, d)
			}}
			plans := func(key string) tierlimit.Limit {
				if key == "t" {
					return tierlimit.Blocked
				}
				return tierlimit.Limit{}
			}
			l := newTenant(t, alg.new, b.rdb, tierlimit.PerSecond(5), WithLimitFunc(plans), WithObserver(obs))
			ctx := context.Background()
			tenanttest.CheckBlocked(t, l, "t", "ok")
			if n, err := b.rdb.Exists(ctx, l.engine().Keys("t")...).Result(); n != 0 || err != nil {
				t.Errorf("Redis holds %d keys of the blocked key (%v), want 0", n, err)
			}
			mu.Lock()
			defer mu.Unlock()
			blocked := 0
			for _, d := range decisions {
				if d.Source == tierlimit.SourceBlocked && !d.Allowed && d.Limit == tierlimit.Blocked {
					blocked++
				}
			}
			if blocked != 5 { // CheckBlocked's
				t.Errorf("observer saw %d blocked denials, want 5: %+v", blocked, decisions)
			}
		})
	}
}

// TestLimitFor: tenanttest.CheckLimitFor on every algorithm.
func TestLimitFor(t *testing.T) {
	b := miniBackend(t)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			with := newTenant(t, alg.new, b.rdb, tenanttest.Default, WithLimitFunc(tenanttest.Plans))
			without := newTenant(t, alg.new, b.rdb, tenanttest.Default)
			tenanttest.CheckLimitFor(t, with, without)
		})
	}
}

// TestLimitLookup: on every algorithm, a failing LimitLookup fails closed
// without a call to Redis, or open to the default with WithLookupFailOpen.
func TestLimitLookup(t *testing.T) {
	b := miniBackend(t)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			var lk tenanttest.Lookup
			closed := newTenant(t, alg.new, b.rdb, tenanttest.Default, WithLimitLookup(lk.Limit), WithPrefix("closed:"))
			tenanttest.CheckLookupFails(t, closed, &lk, "down", "up")
			if n, err := b.rdb.Exists(context.Background(), closed.engine().Keys("down")...).Result(); n != 0 || err != nil {
				t.Errorf("Redis holds %d keys of the key whose lookup failed (%v), want 0", n, err)
			}
			open := newTenant(t, alg.new, b.rdb, tenanttest.Default, WithLimitLookup(lk.Limit), WithLookupFailOpen(), WithPrefix("open:"))
			tenanttest.CheckLookupFailsOpen(t, open, &lk, "down", tenanttest.Default)
		})
	}
}
