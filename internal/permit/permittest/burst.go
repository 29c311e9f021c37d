package permittest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
)

// Burst checks, over 20 rounds, that 12 TryAcquire calls arriving at once
// on a key of 3 permits, none out, get exactly 3 permits: on a key new to
// the limiter (cold) and on one it has used (warm, the same key each
// round, its permits released before the next). A refusal is for want of
// a permit only: a free permit is never refused.
func Burst(t *testing.T, c tierlimit.Concurrency) {
	t.Helper()
	for _, warm := range []bool{false, true} {
		for round := range 20 {
			key := fmt.Sprintf("cold%d", round)
			if warm {
				key = "warm"
			}
			got, ps := burst(t, c, key, 12)
			if got != 3 {
				t.Errorf("round %d (warm %v): %d of 12 simultaneous TryAcquire got a permit of 3, want 3", round, warm, got)
			}
			for _, p := range ps {
				p.Release()
			}
		}
	}
}

// burst runs k TryAcquire calls on key at once and returns how many got a
// permit, and the permits.
func burst(t *testing.T, c tierlimit.Concurrency, key string, k int) (int, []tierlimit.Permit) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ps []tierlimit.Permit
	var got atomic.Int64
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p, ok, err := c.TryAcquire(context.Background(), key)
			if err != nil {
				t.Errorf("TryAcquire(%q) = %v", key, err)
			}
			if ok {
				got.Add(1)
				mu.Lock()
				ps = append(ps, p)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	return int(got.Load()), ps
}

// CloseStalled checks that Close of a limiter newLimiter makes on a
// default go-redis client of addr returns within 1.5 s while Redis is
// paused (CLIENT PAUSE 8000 ALL), with permits out and unused permits
// leased on 8 keys.
func CloseStalled(t *testing.T, addr string, newLimiter func(rdb *redis.Client) Limiter) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	c := newLimiter(rdb)
	ctx := context.Background()
	for i := range 8 {
		key := fmt.Sprint("k", i)
		var ps []tierlimit.Permit
		for range 3 {
			p, err := c.Acquire(ctx, key)
			if err != nil {
				t.Fatalf("Acquire(%q) = %v", key, err)
			}
			ps = append(ps, p)
		}
		ps[0].Release() // one out, the others unused
		ps[1].Release()
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 8000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	// The test's cleanup kills the server: an UNPAUSE would wait for the
	// pause too.
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("Close with Redis paused took %v, want at most 1.5 s", d)
	} else {
		t.Logf("Close with Redis paused: %v", d)
	}
}
