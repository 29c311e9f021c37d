package remote

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
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
			want := tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}
			calls := []struct {
				name    string
				call    func() (tierlimit.Result, error)
				wantErr error
			}{
				{"AllowN(t, 1)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 1) }, nil},
				{"AllowN(t, 0)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 0) }, nil},
				{"AllowN(t, 1000)", func() (tierlimit.Result, error) { return l.AllowN(ctx, "t", 1000) }, nil},
				{"AllowAll(ok 1, t 1)", func() (tierlimit.Result, error) {
					return l.AllowAll(ctx, tierlimit.Take{Key: "ok", N: 1}, tierlimit.Take{Key: "t", N: 1})
				}, nil},
				{"WaitN(t, 1)", func() (tierlimit.Result, error) { return l.WaitN(ctx, "t", 1) }, tierlimit.ErrWaitDeadline},
				{"Settle(t, 4, 0)", func() (tierlimit.Result, error) { return l.Settle(ctx, "t", 4, 0) }, nil},
			}
			for _, c := range calls {
				start := time.Now()
				got, err := c.call()
				if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) || got != want {
					t.Errorf("%s = %+v, %v; want %+v, %v", c.name, got, err, want, c.wantErr)
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("%s took %v, want at once", c.name, took)
				}
			}
			if _, err := l.AllowN(ctx, "t", -1); !errors.Is(err, tierlimit.ErrInvalidCost) {
				t.Errorf("AllowN(t, -1) = %v, want ErrInvalidCost", err)
			}
			if n, err := b.rdb.Exists(ctx, l.engine().Keys("t")...).Result(); n != 0 || err != nil {
				t.Errorf("Redis holds %d keys of the blocked key (%v), want 0", n, err)
			}
			if r, err := l.AllowN(ctx, "ok", 0); err != nil || r.Remaining != 5 {
				t.Errorf("the other key of a blocked AllowAll: Remaining = %d (%v), want 5 (not charged)", r.Remaining, err)
			}
			mu.Lock()
			defer mu.Unlock()
			blocked := 0
			for _, d := range decisions {
				if d.Source == tierlimit.SourceBlocked && !d.Allowed && d.Limit == tierlimit.Blocked {
					blocked++
				}
			}
			if blocked != 5 { // AllowN ×3, AllowAll, WaitN's one try
				t.Errorf("observer saw %d blocked denials, want 5: %+v", blocked, decisions)
			}
		})
	}
}

// TestLimitFor: on every algorithm, the LimitFunc's answer, the default
// for the zero Limit or no function, Blocked, and ErrInvalidLimit for an
// invalid answer (Limit.Validate's, or the algorithm's own rules).
func TestLimitFor(t *testing.T) {
	b := miniBackend(t)
	def := tierlimit.PerSecond(5)
	pro := tierlimit.PerSecond(100)
	plans := map[string]tierlimit.Limit{"pro": pro, "off": tierlimit.Blocked, "bad": tierlimit.PerSecond(0)}
	fn := func(key string) tierlimit.Limit { return plans[key] }
	for _, alg := range algorithms {
		with := newTenant(t, alg.new, b.rdb, def, WithLimitFunc(fn))
		without := newTenant(t, alg.new, b.rdb, def)
		tests := []struct {
			l       tenant
			key     string
			want    tierlimit.Limit
			wantErr error
		}{
			{with, "pro", pro, nil},
			{with, "free", def, nil},
			{with, "off", tierlimit.Blocked, nil},
			{with, "bad", tierlimit.Limit{}, tierlimit.ErrInvalidLimit},
			{with, "", tierlimit.Limit{}, tierlimit.ErrInvalidKey},
			{without, "pro", def, nil},
		}
		for _, tt := range tests {
			got, err := tt.l.LimitFor(tt.key)
			if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("%s: LimitFor(%q) = %v, %v; want %v, %v", alg.name, tt.key, got, err, tt.want, tt.wantErr)
			}
		}
	}
}
