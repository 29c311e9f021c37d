package local

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tierlimit/tierlimit"
)

// countingClock is the real clock (the bubble's, in synctest) counting the
// decisions made on it: each AllowN reads it once.
type countingClock struct{ n atomic.Int64 }

func (c *countingClock) Now() time.Time {
	c.n.Add(1)
	return time.Now()
}

// newBubbled returns a Limiter on the bubble's clock, closed when the test
// ends (inside the bubble: ristretto's goroutines belong to it).
func newBubbled(t *testing.T, limit tierlimit.Limit, opts ...Option) (*Limiter, *countingClock) {
	t.Helper()
	clock := &countingClock{}
	l, err := New(limit, append([]Option{WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clock
}

// TestWaitNDrained: a drained 10/s key admits a waiter 100 ms later, the
// admitting Result returned; an unmeetable deadline fails at once.
func TestWaitNDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newBubbled(t, tierlimit.PerSecond(10))
		ctx := t.Context()
		l.AllowN(ctx, "k", 10)
		t0 := time.Now()
		r, err := l.WaitN(ctx, "k", 1)
		if err != nil || !r.Allowed || r.Remaining != 0 || time.Since(t0) != 100*time.Millisecond {
			t.Errorf("WaitN(drained 10/s) = %+v, %v after %v; want allowed after 100ms", r, err, time.Since(t0))
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		t0 = time.Now()
		r, err = l.WaitN(short, "k", 1)
		if !errors.Is(err, tierlimit.ErrWaitDeadline) || r.Allowed || r.RetryAfter != 100*time.Millisecond || time.Since(t0) != 0 {
			t.Errorf("WaitN(50ms deadline) = %+v, %v after %v; want ErrWaitDeadline, RetryAfter 100ms, at once", r, err, time.Since(t0))
		}
		// A deadline the wait meets.
		t0 = time.Now()
		long, cancel2 := context.WithTimeout(ctx, 150*time.Millisecond)
		defer cancel2()
		if r, err := l.WaitN(long, "k", 1); err != nil || !r.Allowed || time.Since(t0) != 100*time.Millisecond {
			t.Errorf("WaitN(150ms deadline) = %+v, %v after %v; want allowed after 100ms", r, err, time.Since(t0))
		}
	})
}

// TestWaitNDeadlineRealClock: on the real clock, a deadline the wait
// cannot meet fails in a few ms, not at the deadline.
func TestWaitNDeadlineRealClock(t *testing.T) {
	l, err := New(tierlimit.PerMinute(1))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(context.Background(), "k")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err = l.WaitN(ctx, "k", 1)
	if took := time.Since(start); !errors.Is(err, tierlimit.ErrWaitDeadline) || took > 25*time.Millisecond {
		t.Errorf("WaitN(1s deadline, a minute away) = %v after %v; want ErrWaitDeadline within a few ms", err, took)
	}
}

// TestWaitNCrowd: 20 waiters on a drained 1/s key are admitted in the
// order they came, one a second (the bucket's bound), with no error, at
// about one decision per admission: the head's first try after its turn
// is denied, its retry admitted.
func TestWaitNCrowd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, clock := newBubbled(t, tierlimit.PerSecond(1))
		t0 := time.Now()
		const n = 20
		type out struct {
			i   int
			at  time.Duration
			err error
		}
		outs := make(chan out, n)
		for i := range n {
			go func() {
				r, err := l.WaitN(t.Context(), "k", 1)
				if err == nil && !r.Allowed {
					err = errors.New("not allowed")
				}
				outs <- out{i, time.Since(t0), err}
			}()
			synctest.Wait() // in line before the next
		}
		for want := range n {
			o := <-outs
			if o.err != nil || o.i != want || o.at != time.Duration(want)*time.Second {
				t.Errorf("admission %d: waiter %d at t0+%v, %v; want waiter %d at t0+%ds", want, o.i, o.at, o.err, want, want)
			}
		}
		if got, want := clock.n.Load(), int64(1+2*(n-1)); got != want {
			t.Errorf("%d decisions for %d admissions, want %d", got, n, want)
		}
		if l.lines.Len() != 0 {
			t.Errorf("lines.Len() = %d after every waiter left, want 0", l.lines.Len())
		}
	})
}

// TestWaitNEnds: a waiter whose ctx ends gets ctx's error; Close sends every
// waiter away with ErrClosed, at once (bad input is TestInputRules's, at
// the module's root).
func TestWaitNEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newBubbled(t, tierlimit.PerHour(10))
		ctx := t.Context()
		l.AllowN(ctx, "k", 10)
		cctx, cancel := context.WithCancel(ctx)
		errs := make(chan error, 4)
		go func() { _, err := l.WaitN(cctx, "k", 1); errs <- err }()
		time.Sleep(time.Second)
		cancel()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("WaitN whose ctx ended = %v, want context.Canceled", err)
		}
		for range 3 {
			go func() { _, err := l.WaitN(ctx, "k", 1); errs <- err }()
		}
		synctest.Wait()
		t0 := time.Now()
		l.Close()
		for range 3 {
			if err := <-errs; !errors.Is(err, tierlimit.ErrClosed) || time.Since(t0) != 0 {
				t.Errorf("a waiter at Close = %v after %v, want ErrClosed at once", err, time.Since(t0))
			}
		}
		if _, err := l.WaitN(ctx, "k", 1); !errors.Is(err, tierlimit.ErrClosed) {
			t.Errorf("WaitN after Close = %v, want ErrClosed", err)
		}
	})
}

// TestCloseRacesNewMethods: Close (twice) racing AllowAll, WaitN (some
// blocked on a drained key), Settle, AllowN, Reset and SetLimit, many
// rounds: no panic, no caller left blocked, and every call started after
// Close returned gets ErrClosed.
func TestCloseRacesNewMethods(t *testing.T) {
	p := newPlans("slow", tierlimit.PerHour(1))
	rounds := 100
	if testing.Short() {
		rounds = 20
	}
	for round := range rounds {
		l, err := New(tierlimit.PerSecond(1000), WithMaxKeys(64), WithLimitFunc(p.limit))
		if err != nil {
			t.Fatal(err)
		}
		var (
			wg       sync.WaitGroup
			closed   atomic.Bool
			after    atomic.Int64
			problems = make(chan string, 64)
		)
		ctx := context.Background()
		calls := []func(i int) error{
			func(i int) error { _, err := l.AllowN(ctx, "a", 1); return err },
			func(i int) error {
				_, err := l.AllowAll(ctx, tierlimit.Take{Key: "a", N: 1}, tierlimit.Take{Key: "b", N: 2}, tierlimit.Take{Key: "slow", N: 0})
				return err
			},
			func(i int) error { _, err := l.WaitN(ctx, "slow", 1); return err },
			func(i int) error { _, err := l.WaitN(ctx, "b", 1+int64(i%3)); return err },
			func(i int) error { _, err := l.Settle(ctx, "a", 3, int64(i%5)); return err },
			func(i int) error {
				if i%2 == 0 {
					return l.Reset(ctx, "b")
				}
				return l.SetLimit(tierlimit.PerSecond(1000 + int64(i%2)))
			},
		}
		for _, call := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 500; i++ {
					wasClosed := closed.Load()
					err := call(i)
					switch {
					case errors.Is(err, tierlimit.ErrClosed):
						if wasClosed {
							after.Add(1)
							return
						}
					case err != nil:
						problems <- err.Error()
						return
					case wasClosed:
						problems <- "a call started after Close returned got no error"
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%10) * 100 * time.Microsecond)
		var closers sync.WaitGroup
		for range 2 {
			closers.Add(1)
			go func() { defer closers.Done(); l.Close() }()
		}
		closers.Wait()
		closed.Store(true)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: callers still blocked 30s after Close", round)
		}
		close(problems)
		for p := range problems {
			t.Fatalf("round %d: %s", round, p)
		}
		if n := l.lines.Len(); n != 0 {
			t.Fatalf("round %d: %d lines of waiters after Close, want 0", round, n)
		}
	}
}
