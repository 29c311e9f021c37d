package permittest

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// InvalidKeys checks that TryAcquire and Acquire refuse what they must:
// an empty key or one over MaxKeyLen (ErrInvalidKey), the keys "neg" and
// "huge", for which c's permit func must give a negative number and one
// over MaxPermits (ErrInvalidLimit), and a nil context (ErrInvalidOption).
func InvalidKeys(t *testing.T, c tierlimit.Concurrency) {
	t.Helper()
	ctx := context.Background()
	for _, tt := range []struct {
		ctx  context.Context
		key  string
		want error
	}{
		{ctx, "", tierlimit.ErrInvalidKey},
		{ctx, strings.Repeat("x", tierlimit.MaxKeyLen+1), tierlimit.ErrInvalidKey},
		{ctx, "neg", tierlimit.ErrInvalidLimit},
		{ctx, "huge", tierlimit.ErrInvalidLimit},
		{nil, "k", tierlimit.ErrInvalidOption},
	} {
		if _, _, err := c.TryAcquire(tt.ctx, tt.key); !errors.Is(err, tt.want) {
			t.Errorf("TryAcquire(%.10q) = %v, want %v", tt.key, err, tt.want)
		}
		if _, err := c.Acquire(tt.ctx, tt.key); !errors.Is(err, tt.want) {
			t.Errorf("Acquire(%.10q) = %v, want %v", tt.key, err, tt.want)
		}
	}
}

// Closed checks that TryAcquire and Acquire on c, closed, return
// ErrClosed.
func Closed(t *testing.T, c tierlimit.Concurrency) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := c.TryAcquire(ctx, "k"); err != tierlimit.ErrClosed {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if _, err := c.Acquire(ctx, "k"); err != tierlimit.ErrClosed {
		t.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
}

// PastDeadlineClose checks that Acquire with a deadline passed returns
// context.DeadlineExceeded at once, then closes c twice and checks it as
// Closed does.
func PastDeadlineClose(t *testing.T, c Limiter) {
	t.Helper()
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := c.Acquire(past, "k"); err != context.DeadlineExceeded {
		t.Errorf("Acquire past its deadline = %v, want context.DeadlineExceeded", err)
	}
	c.Close()
	c.Close()
	Closed(t, c)
}

// Allocs checks that a TryAcquire and Release on key "k" of c, warm,
// allocate nothing; what names them in the error.
func Allocs(t *testing.T, c tierlimit.Concurrency, what string) {
	t.Helper()
	ctx := context.Background()
	f := func() {
		p, ok, err := c.TryAcquire(ctx, "k")
		if !ok || err != nil {
			t.Fatalf("TryAcquire = %v, %v; want a permit", ok, err)
		}
		p.Release()
	}
	f()
	if got := testing.AllocsPerRun(1000, f); got != 0 {
		t.Errorf("%s: %v allocations, want 0", what, got)
	}
}

// CloseRace checks, 5 times over a limiter newLimiter returns, that Close
// racing 8 goroutines of 20 calls each never panics or blocks, and that
// no goroutine is left behind. With keepLast, each goroutine's last
// permit is released only after Close (twice: harmless).
func CloseRace(t *testing.T, newLimiter func() Limiter, keepLast bool) {
	t.Helper()
	before := runtime.NumGoroutine()
	for range 5 {
		c := newLimiter()
		var wg sync.WaitGroup
		var late []tierlimit.Permit
		var mu sync.Mutex
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				for j := range 20 {
					var p tierlimit.Permit
					var err error
					if (i+j)%2 == 0 {
						p, err = c.Acquire(ctx, "k")
					} else {
						p, _, err = c.TryAcquire(ctx, "k")
					}
					if err != nil && err != tierlimit.ErrClosed {
						t.Errorf("call racing Close = %v, want nil or ErrClosed", err)
					}
					if err != nil && p.Valid() {
						t.Errorf("call racing Close = %v with a permit %#v, want the zero Permit", err, p)
						p = tierlimit.Permit{}
					}
					if p.Valid() && keepLast && j == 19 {
						mu.Lock()
						late = append(late, p)
						mu.Unlock()
					} else if p.Valid() {
						p.Release()
						p.Release()
					}
				}
			}()
		}
		time.Sleep(time.Duration(rand.N(20)) * time.Millisecond)
		c.Close()
		wg.Wait()
		for _, p := range late {
			p.Release()
			p.Release()
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, want at most %d", n, before)
	}
}

// Blocked checks that c, whose permit func answers tierlimit.NoPermits
// for key "none", refuses it: TryAcquire false with no error, Acquire
// tierlimit.ErrWaitDeadline at once, and that other keys are served.
func Blocked(t *testing.T, c tierlimit.Concurrency) {
	t.Helper()
	ctx := context.Background()
	for range 3 {
		if p, ok, err := c.TryAcquire(ctx, "none"); ok || err != nil || p.Valid() {
			t.Errorf("TryAcquire of a blocked key = %v, %v, want false, nil", ok, err)
		}
	}
	start := time.Now()
	if _, err := c.Acquire(ctx, "none"); !errors.Is(err, tierlimit.ErrWaitDeadline) || time.Since(start) > time.Second {
		t.Errorf("Acquire of a blocked key = %v after %v, want ErrWaitDeadline at once", err, time.Since(start))
	}
	p, ok, err := c.TryAcquire(ctx, "other")
	if !ok || err != nil {
		t.Errorf("TryAcquire of another key = %v, %v, want a permit", ok, err)
	}
	p.Release()
}
