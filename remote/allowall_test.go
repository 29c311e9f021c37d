package remote

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestAllowAllAllOrNothing decides several keys of different limits at
// once, for every algorithm: admitted only if every key admits, and a
// refused call charges no key (each key's state read again by a peek).
func TestAllowAllAllOrNothing(t *testing.T) {
	ctx := context.Background()
	plans := map[string]tierlimit.Limit{"org": tierlimit.PerMinute(3)}
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0)
			l := newTenant(t, alg.new, rdb, tierlimit.PerMinute(5), WithLimitFunc(func(k string) tierlimit.Limit { return plans[k] }))
			peek := func(key string) int64 {
				r, err := l.AllowN(ctx, key, 0)
				if err != nil {
					t.Fatal(err)
				}
				return r.Remaining
			}
			steps := []struct {
				takes   []tierlimit.Take
				allowed bool
				rem     int64    // when allowed: the smallest Remaining of the keys taken
				left    [3]int64 // u1, u2, org after
			}{
				{[]tierlimit.Take{{Key: "u1", N: 2}, {Key: "org", N: 1}}, true, 2, [3]int64{3, 5, 2}},
				{[]tierlimit.Take{{Key: "u1", N: 1}, {Key: "u2", N: 1}, {Key: "org", N: 1}, {Key: "u1", N: 1}}, true, 1, [3]int64{1, 4, 1}},
				{[]tierlimit.Take{{Key: "u2", N: 4}, {Key: "org", N: 2}}, false, 0, [3]int64{1, 4, 1}}, // the org refuses
				{[]tierlimit.Take{{Key: "u1", N: 2}, {Key: "org", N: 1}}, false, 0, [3]int64{1, 4, 1}}, // u1 refuses
				{[]tierlimit.Take{{Key: "u2", N: 4}, {Key: "org", N: 1}}, true, 0, [3]int64{1, 0, 0}},
				{[]tierlimit.Take{{Key: "u1", N: 0}, {Key: "org", N: 0}}, true, 0, [3]int64{1, 0, 0}}, // a peek
			}
			for i, s := range steps {
				r, err := l.AllowAll(ctx, s.takes...)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				got := [3]int64{peek("u1"), peek("u2"), peek("org")}
				if r.Allowed != s.allowed || got != s.left {
					t.Errorf("step %d: AllowAll(%v) = %v, left %v; want %v, %v", i, s.takes, r.Allowed, got, s.allowed, s.left)
				}
				if r.Allowed && r.Remaining != s.rem {
					t.Errorf("step %d: Remaining %d, want %d", i, r.Remaining, s.rem)
				}
				if !r.Allowed && r.RetryAfter <= 0 {
					t.Errorf("step %d: denied with RetryAfter %v, want > 0", i, r.RetryAfter)
				}
			}
		})
	}
}

// TestAllowAllWithLimits applies every limit to every key: WithLimits'
// extra refuses a take the key's own limit admits.
func TestAllowAllWithLimits(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			m, rdb := redistest.Mini(t)
			m.SetTime(t0)
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(10), WithLimits(tierlimit.PerMinute(4)))
			if r, _ := l.AllowAll(ctx, tierlimit.Take{Key: "a", N: 3}, tierlimit.Take{Key: "b", N: 4}); !r.Allowed || r.Remaining != 0 {
				t.Fatalf("AllowAll(a 3, b 4) = %+v, want allowed, 0 left", r)
			}
			r, _ := l.AllowAll(ctx, tierlimit.Take{Key: "a", N: 2}, tierlimit.Take{Key: "c", N: 1})
			if r.Allowed || r.Limit != tierlimit.PerMinute(4) {
				t.Errorf("AllowAll(a 2, c 1) = %+v, want denied by 4/1m", r)
			}
			if r, _ := l.AllowN(ctx, "c", 0); r.Remaining != 4 {
				t.Errorf("c after the refusal: %d left, want 4", r.Remaining)
			}
		})
	}
}

// TestAllowAllOneCall: on a single Redis, AllowAll of several keys is one
// script call.
func TestAllowAllOneCall(t *testing.T) {
	_, rdb := redistest.Mini(t)
	l := newTenant(t, ctor(NewTokenBucket), rdb, tierlimit.PerSecond(10))
	if _, err := l.Allow(context.Background(), "warm-up"); err != nil { // loads the script
		t.Fatal(err)
	}
	var calls callcount.Hook
	rdb.AddHook(&calls)
	if _, err := l.AllowAll(context.Background(), tierlimit.Take{Key: "a", N: 1}, tierlimit.Take{Key: "b", N: 1},
		tierlimit.Take{Key: "c", N: 1}); err != nil {
		t.Fatal(err)
	}
	if calls.Calls() != 1 {
		t.Errorf("AllowAll of 3 keys made %d script calls, want 1", calls.Calls())
	}
}

// TestAllowAllOrgOverUsers runs users at PerSecond(1000) under one org at
// PerSecond(20), each request AllowAll({user, 1}, {org, 1}), from many
// goroutines for about a second, on a single Redis and on a 3-master
// Cluster (keys in several slots: refusals give back what earlier slots
// charged). The org's bound holds, and afterwards a user can still take
// 900: the refused calls charged the users nothing.
func TestAllowAllOrgOverUsers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for ~3 s")
	}
	t.Run("redis", func(t *testing.T) { orgOverUsers(t, redistest.Start(t).Client(t)) })
	t.Run("cluster", func(t *testing.T) { orgOverUsers(t, redistest.StartCluster(t).Client(t)) })
}

func orgOverUsers(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	org := tierlimit.PerSecond(20)
	for _, alg := range []struct {
		name string
		new  constructor
	}{{"TokenBucket", ctor(NewTokenBucket)}, {"GCRA", ctor(NewGCRA)}} {
		t.Run(alg.name, func(t *testing.T) {
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(1000), WithPrefix(alg.name+":"),
				WithLimitFunc(func(k string) tierlimit.Limit {
					if k == "org" {
						return org
					}
					return tierlimit.Limit{}
				}))
			const users, perUser = 3, 3
			var admitted, calls atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			deadline := start.Add(time.Second)
			for u := range users {
				for range perUser {
					wg.Add(1)
					go func(user string) {
						defer wg.Done()
						for time.Now().Before(deadline) {
							r, err := l.AllowAll(ctx, tierlimit.Take{Key: user, N: 1}, tierlimit.Take{Key: "org", N: 1})
							if err != nil {
								t.Error(err)
								return
							}
							calls.Add(1)
							if r.Allowed {
								admitted.Add(1)
							}
						}
					}(fmt.Sprint("user:", u))
				}
			}
			wg.Wait()
			elapsed := time.Since(start)
			bound := org.Capacity() + int64(float64(org.Rate)*elapsed.Seconds()) + 1
			t.Logf("%d admitted of %d calls in %v; the org's bound %d", admitted.Load(), calls.Load(), elapsed.Round(time.Millisecond), bound)
			if admitted.Load() > bound {
				t.Errorf("admitted %d, more than the org's bound %d", admitted.Load(), bound)
			}
			if admitted.Load() < org.Capacity() {
				t.Errorf("admitted %d, fewer than the org's burst %d", admitted.Load(), org.Capacity())
			}
			for u := range users {
				user := fmt.Sprint("user:", u)
				if r, err := l.AllowN(ctx, user, 900); err != nil || !r.Allowed {
					t.Errorf("%s: AllowN(900) after the run = %+v, %v; want allowed (refusals charge nothing)", user, r, err)
				}
			}
			if r, _ := l.AllowN(ctx, "org", 0); r.Remaining > org.Capacity() {
				t.Errorf("org: %d remaining, above its capacity", r.Remaining)
			}
		})
	}
}
