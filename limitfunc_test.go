package tierlimit_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLimitFuncAskedOncePerLease: hybrid asks a LimitFunc at most once per
// key per lease TTL on every path (AllowN, AllowAll, WaitN, Settle) on warm
// keys, with default options and go-redis's default client; with a 50 ms
// LimitFunc, AllowAll on warm keys takes at most 5 ms at the median.
func TestLimitFuncAskedOncePerLease(t *testing.T) {
	s := redistest.Start(t)
	rdb := defaultClient(t, s)
	var (
		mu   sync.Mutex
		asks = map[string]int{}
		slow atomic.Bool
	)
	plan := func(key string) tierlimit.Limit {
		mu.Lock()
		asks[key]++
		mu.Unlock()
		if slow.Load() {
			time.Sleep(50 * time.Millisecond)
		}
		return tierlimit.PerSecond(100_000)
	}
	lim, err := hybrid.New(rdb, tierlimit.PerSecond(10), hybrid.WithLimitFunc(plan))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	paths := []struct {
		name string
		call func(key string) (tierlimit.Result, error)
	}{
		{"AllowN", func(k string) (tierlimit.Result, error) { return lim.AllowN(ctx, k, 1) }},
		{"AllowAll", func(k string) (tierlimit.Result, error) {
			return lim.AllowAll(ctx, tierlimit.Take{Key: k, N: 1}, tierlimit.Take{Key: k + "/b", N: 2})
		}},
		{"WaitN", func(k string) (tierlimit.Result, error) { return lim.WaitN(ctx, k, 1) }},
		{"Settle", func(k string) (tierlimit.Result, error) { return lim.Settle(ctx, k, 3, 1) }},
	}
	// A window shorter than the lease TTL: at most one ask per key in it.
	const window = hybrid.DefaultLeaseTTL / 2
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			key := "plan:" + p.name
			if _, err := p.call(key); err != nil { // warm: the key's first ask
				t.Fatal(err)
			}
			mu.Lock()
			clear(asks)
			mu.Unlock()
			calls := 0
			for end := time.Now().Add(window); time.Now().Before(end) && calls < 20_000; calls++ {
				if _, err := p.call(key); err != nil {
					t.Fatalf("call %d: %v", calls, err)
				}
				if calls%16 == 0 {
					time.Sleep(time.Millisecond) // spread over the window
				}
			}
			mu.Lock()
			got := maps(asks)
			mu.Unlock()
			t.Logf("%d calls in %v asked the LimitFunc %v", calls, window, got)
			for k, n := range got {
				if n > 1 {
					t.Errorf("%s asked the LimitFunc %d times for %q within %v, want at most once per lease TTL (%v)",
						p.name, n, k, window, hybrid.DefaultLeaseTTL)
				}
			}
		})
	}

	// A changed answer reaches a hot key, whose lease is refilled in the
	// background, within a lease TTL (and a refill interval to claim).
	t.Run("plan change", func(t *testing.T) {
		var pro atomic.Bool
		lim, err := hybrid.New(rdb, tierlimit.PerSecond(10), hybrid.WithPrefix("change:"), hybrid.WithLimitFunc(func(string) tierlimit.Limit {
			if pro.Load() {
				return tierlimit.PerSecond(200_000)
			}
			return tierlimit.PerSecond(100_000)
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		if _, err := lim.Allow(ctx, "hot"); err != nil {
			t.Fatal(err)
		}
		pro.Store(true)
		changed := time.Now()
		for calls := 0; ; calls++ {
			r, err := lim.Allow(ctx, "hot")
			if err != nil {
				t.Fatal(err)
			}
			if r.Limit == tierlimit.PerSecond(200_000) {
				t.Logf("the new plan applied after %v (%d calls)", time.Since(changed), calls)
				break
			}
			if took := time.Since(changed); took > 2*hybrid.DefaultLeaseTTL {
				t.Fatalf("the old plan still applies %v after the change, want the new one within a lease TTL (%v)", took, hybrid.DefaultLeaseTTL)
			}
			if calls%16 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	})

	t.Run("slow LimitFunc", func(t *testing.T) {
		slow.Store(true)
		defer slow.Store(false)
		all := paths[1].call
		if _, err := all("slow"); err != nil { // warm: two asks of 50 ms
			t.Fatal(err)
		}
		var took []time.Duration
		for range 100 {
			start := time.Now()
			if _, err := all("slow"); err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		median := took[len(took)/2]
		t.Logf("AllowAll on warm keys with a 50 ms LimitFunc: median %v, worst %v", median, took[len(took)-1])
		if median > 5*time.Millisecond {
			t.Errorf("AllowAll's median with a 50 ms LimitFunc = %v, want at most 5ms", median)
		}
	})
}

// maps returns a copy of m.
func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
