package remote

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestWaitN checks WaitN on a real Redis and the server's clock, for every
// algorithm: a drained PerSecond(10) key admits a waiter after about
// 100 ms, never before the token is there (a window algorithm, when its
// window ends), and a deadline that cannot be met fails at once with
// ErrWaitDeadline, not when the deadline passes. The upper bounds leave a
// loaded machine's scheduling delays room (a run beside a busy loop woke
// the waiter after 168 ms).
func TestWaitN(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			l := newTenant(t, alg.new, rdb, tierlimit.PerSecond(10), WithPrefix("wait:"))
			if !alg.windowed {
				drained := time.Now() // at most Redis's clock when it drains the key
				if r, err := l.AllowN(ctx, "drained", 10); err != nil || !r.Allowed {
					t.Fatalf("AllowN(10) = %+v, %v", r, err)
				}
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				r, err := l.WaitN(wctx, "drained", 1)
				cancel()
				if took := time.Since(drained); err != nil || !r.Allowed || took < 99*time.Millisecond || took > 500*time.Millisecond {
					t.Errorf("WaitN(1) on a drained 10/s key = %+v, %v %v after the drain; want admitted after ~100ms", r, err, took)
				}
			}
			// A deadline the wait cannot meet: fail at once. A window
			// that ends within the deadline would admit (a fixed window
			// ends on the second): drain the next window instead.
			// A loaded machine may let tokens come back between the drain
			// and the peek: drain again, a bounded number of times.
			drained := false
			for range 5 {
				if _, err := l.AllowN(ctx, "far", 10); err != nil {
					t.Fatal(err)
				}
				r, _ := l.AllowN(ctx, "far", 0)
				if r.Remaining > 2 {
					continue // WaitN(5) below could be met within its deadline
				}
				if r.ResetAfter > 300*time.Millisecond {
					drained = true
					break
				}
				time.Sleep(r.ResetAfter + time.Millisecond)
			}
			if !drained {
				t.Fatal("could not drain the key in 5 tries")
			}
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := l.WaitN(wctx, "far", 5)
			if took := time.Since(start); !errors.Is(err, tierlimit.ErrWaitDeadline) || took >= 200*time.Millisecond {
				t.Errorf("WaitN(5) with 200 ms to go = %v after %v; want ErrWaitDeadline before the deadline", err, took)
			}
		})
	}
}

// TestWaitNCrowd runs 20 waiters on one PerSecond(1) key, in a synctest
// bubble whose clock the limiter decides on (a client clock, on a real
// Redis): every one is admitted, with no error, never faster than the
// bucket allows, and Redis sees about one call per RetryAfter (the head of
// the line's), not one per waiter per retry.
func TestWaitNCrowd(t *testing.T) {
	addr := redistest.Start(t).Addr
	synctest.Test(t, func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		var calls callcount.Hook
		rdb.AddHook(&calls)
		l := newTenant(t, ctor(NewTokenBucket), rdb, tierlimit.PerSecond(1), WithClientClock(wallClock{}), WithPrefix("crowd:"))
		ctx := context.Background()
		const waiters = 20
		start := time.Now()
		var mu sync.Mutex
		var admitted []time.Duration
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				r, err := l.WaitN(ctx, "hot", 1)
				if err != nil || !r.Allowed {
					t.Errorf("WaitN = %+v, %v; want admitted", r, err)
					return
				}
				mu.Lock()
				admitted = append(admitted, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(admitted) != waiters {
			t.Fatalf("%d admitted, want %d", len(admitted), waiters)
		}
		// The i-th admission (from 0) needs i refills of 1 s after the
		// first token: one bucket's bound.
		for i, at := range admitted {
			if at < time.Duration(i)*time.Second {
				t.Errorf("admission %d at %v, before the bucket allows (%v)", i, at, time.Duration(i)*time.Second)
			}
		}
		if got := calls.Calls(); got > 2*waiters+2 {
			t.Errorf("%d script calls for %d waiters, want at most %d (one per RetryAfter)", got, waiters, 2*waiters+2)
		} else {
			t.Logf("%d script calls for %d waiters over %v", got, waiters, time.Since(start))
		}
	})
}

// wallClock reads time.Now: inside a synctest bubble, the bubble's clock.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
