package remote

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu        sync.Mutex
	decisions []tierlimit.Decision
	calls     []tierlimit.RedisCall
}

func (r *recorder) observer() *tierlimit.Observer {
	return &tierlimit.Observer{
		Decision: func(d tierlimit.Decision) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.decisions = append(r.decisions, d)
		},
		RedisCall: func(c tierlimit.RedisCall) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.calls = append(r.calls, c)
		},
	}
}

func (r *recorder) ops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []string
	for _, c := range r.calls {
		ops = append(ops, c.Op)
	}
	return ops
}

// TestObserverDecisions checks, for every algorithm, that each AllowN is
// reported as one decision and one "allow" call, and Reset as a "reset"
// call; bad input reports nothing.
func TestObserverDecisions(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			rec := &recorder{}
			b := miniBackend(t)
			lim, err := alg.new(b.rdb, tierlimit.PerHour(2), WithObserver(rec.observer()))
			if err != nil {
				t.Fatal(err)
			}
			var want []tierlimit.Decision
			for i, n := range []int64{1, 1, 1, 0} {
				res, err := lim.AllowN(ctx, "k", n)
				if err != nil {
					t.Fatalf("AllowN #%d: %v", i+1, err)
				}
				want = append(want, tierlimit.Decision{Allowed: res.Allowed, Source: tierlimit.SourceRemote, N: n, Limit: res.Limit})
			}
			if _, err := lim.AllowN(ctx, "", 1); !errors.Is(err, tierlimit.ErrInvalidKey) {
				t.Fatalf("AllowN with an empty key = %v, want ErrInvalidKey", err)
			}
			if err := lim.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			got := rec.decisions
			rec.mu.Unlock()
			if len(got) != len(want) {
				t.Fatalf("%d decisions reported, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i].Latency <= 0 {
					t.Errorf("decision %d: Latency %v, want > 0", i+1, got[i].Latency)
				}
				got[i].Latency = 0
				if got[i] != want[i] {
					t.Errorf("decision %d = %+v, want %+v", i+1, got[i], want[i])
				}
			}
			if ops, wantOps := rec.ops(), []string{"allow", "allow", "allow", "allow", "reset"}; !slices.Equal(ops, wantOps) {
				t.Errorf("calls reported %q, want %q", ops, wantOps)
			}
		})
	}
}

// TestObserverErrors checks that a failing Redis is reported as a call
// with its error, and not as a decision.
func TestObserverErrors(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	rec := &recorder{}
	tb, err := NewTokenBucket(rdb, tierlimit.PerHour(10), WithObserver(rec.observer()))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := tb.Allow(context.Background(), "k"); err == nil {
		t.Fatal("Allow with Redis down = nil error, want one")
	}
	if len(rec.calls) != 1 || rec.calls[0].Op != "allow" || rec.calls[0].Err == nil {
		t.Errorf("calls reported %+v, want one failed allow", rec.calls)
	}
	if len(rec.decisions) != 0 {
		t.Errorf("decisions reported %+v, want none for a failed call", rec.decisions)
	}
	if _, err := NewTokenBucket(rdb, tierlimit.PerHour(1), WithObserver(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WithObserver(nil): err = %v, want ErrInvalidOption", err)
	}
	if _, err := NewTokenBucket(rdb, tierlimit.PerHour(1), WithLogger(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WithLogger(nil): err = %v, want ErrInvalidOption", err)
	}
}

// TestObserverTenantCalls checks AllowAll (one "allow" call and one
// decision on a single Redis) and Settle (one "settle" call, no decision).
func TestObserverTenantCalls(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	b := miniBackend(t)
	tb, err := NewTokenBucket(b.rdb, tierlimit.PerHour(10), WithObserver(rec.observer()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.AllowAll(ctx, tierlimit.Take{Key: "a", N: 2}, tierlimit.Take{Key: "b", N: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Settle(ctx, "a", 2, 1); err != nil {
		t.Fatal(err)
	}
	if ops, want := rec.ops(), []string{"allow", "settle"}; !slices.Equal(ops, want) {
		t.Errorf("calls reported %q, want %q", ops, want)
	}
	if len(rec.decisions) != 1 || rec.decisions[0].N != 5 || !rec.decisions[0].Allowed {
		t.Errorf("decisions reported %+v, want one of N 5, allowed", rec.decisions)
	}
}
