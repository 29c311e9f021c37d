package wait

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tierlimit/tierlimit"
)

// perSecond is a key that admits one request a second, exactly, on the
// bubble's clock, and counts the tries it is asked.
type perSecond struct {
	mu       sync.Mutex
	next     time.Time // when the next request is admitted
	calls    int
	inFlight atomic.Int32
	maxIn    atomic.Int32
}

func (p *perSecond) try() (tierlimit.Result, error) {
	if n := p.inFlight.Add(1); n > p.maxIn.Load() {
		p.maxIn.Store(n)
	}
	defer p.inFlight.Add(-1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	now := time.Now()
	if now.Before(p.next) {
		return tierlimit.Result{RetryAfter: p.next.Sub(now)}, nil
	}
	p.next = now.Add(time.Second)
	return tierlimit.Result{Allowed: true}, nil
}

// denied is a try that always denies, with retry after d.
func denied(d time.Duration) func() (tierlimit.Result, error) {
	return func() (tierlimit.Result, error) { return tierlimit.Result{RetryAfter: d}, nil }
}

func admitted() (tierlimit.Result, error) { return tierlimit.Result{Allowed: true}, nil }

// outcome is what one N call returned, and when.
type outcome struct {
	res tierlimit.Result
	err error
	at  time.Time
}

// start runs N in a goroutine and waits until it is durably blocked or
// done, so that callers join the line in the order they are started.
func start(ctx context.Context, ls *Lines, key string, try func() (tierlimit.Result, error)) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := ls.N(ctx, key, try)
		ch <- outcome{res, err, time.Now()}
	}()
	synctest.Wait()
	return ch
}

// TestFIFOAndTriesPerTurn: 20 waiters on a key admitting one a second are
// admitted in the order they came, a second apart; only the head tries
// (one try in flight at a time), about one try per admission: the head's
// first try after its turn comes is denied, the retry after RetryAfter is
// admitted.
func TestFIFOAndTriesPerTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ls Lines
		p := &perSecond{}
		t0 := time.Now()
		const n = 20
		var order []int
		var mu sync.Mutex
		chans := make([]<-chan outcome, n)
		for i := range n {
			chans[i] = start(t.Context(), &ls, "k", func() (tierlimit.Result, error) {
				res, err := p.try()
				if res.Allowed {
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
				}
				return res, err
			})
		}
		for i, ch := range chans {
			o := <-ch
			if o.err != nil || !o.res.Allowed {
				t.Fatalf("waiter %d: N = %+v, %v; want allowed, nil", i, o.res, o.err)
			}
			if got, want := o.at.Sub(t0), time.Duration(i)*time.Second; got != want {
				t.Errorf("waiter %d admitted at t0+%v, want t0+%v", i, got, want)
			}
		}
		for i, w := range order {
			if w != i {
				t.Fatalf("admission order %v, want 0…%d in order", order, n-1)
			}
		}
		// One try admits the first; each later one is denied once (the
		// bucket is empty when its turn comes) and admitted on the retry.
		if want := 1 + 2*(n-1); p.calls != want {
			t.Errorf("%d tries for %d admissions, want %d (one per turn plus one retry)", p.calls, n, want)
		}
		if m := p.maxIn.Load(); m != 1 {
			t.Errorf("%d tries in flight at once, want 1: only the head tries", m)
		}
		if l := ls.Len(); l != 0 {
			t.Errorf("Len() = %d after every waiter left, want 0", l)
		}
	})
}

// TestDeadlineAtOnce: ErrWaitDeadline comes without sleeping, whether the
// caller's own RetryAfter passes its deadline, a head's next try is after
// it when it joins, or the head learns so while the caller is in line.
func TestDeadlineAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ls Lines
		t0 := time.Now()
		ctx1s, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()

		// Alone: its own try says 10 s.
		res, err := ls.N(ctx1s, "alone", denied(10*time.Second))
		if !errors.Is(err, tierlimit.ErrWaitDeadline) || res.RetryAfter != 10*time.Second || time.Since(t0) != 0 {
			t.Errorf("N alone = %v, %v after %v; want ErrWaitDeadline, RetryAfter 10s, at once", res.RetryAfter, err, time.Since(t0))
		}

		// Behind a head (no deadline) whose next try is in 10 s.
		head, stop := context.WithCancel(t.Context())
		hc := start(head, &ls, "k", denied(10*time.Second))
		tried := false
		_, err = ls.N(ctx1s, "k", func() (tierlimit.Result, error) { tried = true; return admitted() })
		if !errors.Is(err, tierlimit.ErrWaitDeadline) || tried || time.Since(t0) != 0 {
			t.Errorf("N behind a head pausing 10s = %v, tried %v, after %v; want ErrWaitDeadline, no try, at once", err, tried, time.Since(t0))
		}

		// In line while the head tries: the head's 10 s answer fails it.
		release := make(chan struct{})
		stop()
		if o := <-hc; !errors.Is(o.err, context.Canceled) {
			t.Fatalf("cancelled head: %v, want context.Canceled", o.err)
		}
		hc = start(t.Context(), &ls, "k2", func() (tierlimit.Result, error) {
			<-release
			return denied(10 * time.Second)()
		})
		wc := start(ctx1s, &ls, "k2", admitted)
		close(release)
		synctest.Wait()
		select {
		case o := <-wc:
			if !errors.Is(o.err, tierlimit.ErrWaitDeadline) || o.at != t0 {
				t.Errorf("waiter in line when the head learnt 10s: %v at t0+%v; want ErrWaitDeadline at once", o.err, o.at.Sub(t0))
			}
		default:
			t.Errorf("waiter in line when the head learnt 10s still waits, want ErrWaitDeadline at once")
		}
		// The head itself, with no deadline, still waits; a waiter whose
		// deadline the head's next try meets stays in line.
		ctx20s, cancel20 := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel20()
		wc = start(ctx20s, &ls, "k2", admitted)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		// The head retries at 10 s, denied again: its next try is at 20 s,
		// which the second waiter's deadline (t0+20s) still meets.
		select {
		case o := <-wc:
			t.Errorf("waiter with a 20s deadline: %v at t0+%v, want still in line", o.err, o.at.Sub(t0))
		default:
		}
		if l := ls.Len(); l != 1 {
			t.Errorf("Len() = %d with one line, want 1", l)
		}
		ls.Close()
		for _, ch := range []<-chan outcome{hc, wc} {
			if o := <-ch; !errors.Is(o.err, tierlimit.ErrClosed) {
				t.Errorf("after Close: %v, want ErrClosed", o.err)
			}
		}
		if l := ls.Len(); l != 0 {
			t.Errorf("Len() = %d after every waiter left, want 0", l)
		}
	})
}

// TestCancel: a queued waiter whose ctx ends leaves the line and the others
// keep their places; a head whose ctx ends passes the turn at once.
func TestCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ls Lines
		p := &perSecond{}
		t0 := time.Now()
		c0 := start(t.Context(), &ls, "k", p.try) // admitted at once
		if o := <-c0; !o.res.Allowed {
			t.Fatalf("first N = %+v, want allowed", o.res)
		}
		headCtx, cancelHead := context.WithCancel(t.Context())
		midCtx, cancelMid := context.WithCancel(t.Context())
		ch := start(headCtx, &ls, "k", p.try) // head: denied, pauses 1 s
		cm := start(midCtx, &ls, "k", p.try)
		cl := start(t.Context(), &ls, "k", p.try)
		cancelMid()
		synctest.Wait()
		if o := <-cm; !errors.Is(o.err, context.Canceled) || o.at != t0 {
			t.Errorf("cancelled queued waiter: %v at t0+%v, want context.Canceled at once", o.err, o.at.Sub(t0))
		}
		time.Sleep(500 * time.Millisecond)
		cancelHead()
		synctest.Wait()
		if o := <-ch; !errors.Is(o.err, context.Canceled) {
			t.Errorf("cancelled head: %v, want context.Canceled", o.err)
		}
		// The last waiter is head now: it tries at once (denied, 500 ms left)
		// and is admitted at t0+1s.
		o := <-cl
		if !o.res.Allowed || o.err != nil || o.at.Sub(t0) != time.Second {
			t.Errorf("last waiter: %+v, %v at t0+%v; want allowed at t0+1s", o.res, o.err, o.at.Sub(t0))
		}
		if l := ls.Len(); l != 0 {
			t.Errorf("Len() = %d after every waiter left, want 0", l)
		}
		// A ctx that ended before N: no try.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		tried := false
		if _, err := ls.N(ctx, "k", func() (tierlimit.Result, error) { tried = true; return admitted() }); !errors.Is(err, context.Canceled) || tried {
			t.Errorf("N with an ended ctx = %v, tried %v; want context.Canceled, no try", err, tried)
		}
	})
}

// TestTurnAsCtxEnds races a waiter's ctx ending against its turn coming,
// many times: whichever it sees first, it goes without trying (a try may
// charge), the waiter behind it is served and no line is left behind (a
// lost turn would leave it blocked: the bubble would report a deadlock).
func TestTurnAsCtxEnds(t *testing.T) {
	for round := range 300 {
		synctest.Test(t, func(t *testing.T) {
			var ls Lines
			release := make(chan struct{})
			ctx, cancel := context.WithCancel(t.Context())
			// The head ends the middle waiter's ctx and at once leaves (its
			// turn): the middle waiter, woken by its ctx, finds it is the
			// head when it goes to quit, or is woken by its turn and finds
			// its ctx ended.
			ch := start(t.Context(), &ls, "k", func() (tierlimit.Result, error) {
				<-release
				cancel()
				return admitted()
			})
			var midTried atomic.Bool
			cm := start(ctx, &ls, "k", func() (tierlimit.Result, error) {
				midTried.Store(true)
				return admitted()
			})
			cl := start(t.Context(), &ls, "k", admitted)
			close(release)
			if o := <-ch; !o.res.Allowed {
				t.Fatalf("round %d: head = %+v, %v; want allowed", round, o.res, o.err)
			}
			if o := <-cm; !errors.Is(o.err, context.Canceled) || midTried.Load() {
				t.Fatalf("round %d: middle = %+v, %v, tried %v; want context.Canceled, no try (its ctx ended before its turn)",
					round, o.res, o.err, midTried.Load())
			}
			if o := <-cl; !o.res.Allowed || o.err != nil {
				t.Fatalf("round %d: last = %+v, %v; want allowed", round, o.res, o.err)
			}
			if l := ls.Len(); l != 0 {
				t.Fatalf("round %d: Len() = %d after every waiter left, want 0", round, l)
			}
		})
	}
}

// TestStress runs waiters on a few keys with random cancellations, on
// real time and many Ps, and checks that every call ends, at most one try
// per key is in flight, every line goes, and no goroutine stays behind.
func TestStress(t *testing.T) {
	before := runtime.NumGoroutine()
	var ls Lines
	var wg sync.WaitGroup
	var inFlight [4]atomic.Int32
	var bad atomic.Int32
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				k := (g + i) % len(inFlight)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(g%5)*50*time.Microsecond)
				if g%5 == 4 {
					ctx, cancel = context.WithCancel(context.Background())
				}
				tries := 0
				_, err := ls.N(ctx, fmt.Sprint("k", k), func() (tierlimit.Result, error) {
					if inFlight[k].Add(1) != 1 {
						bad.Add(1)
					}
					defer inFlight[k].Add(-1)
					tries++
					if tries < 2 {
						return tierlimit.Result{RetryAfter: 10 * time.Microsecond}, nil
					}
					return admitted()
				})
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, tierlimit.ErrWaitDeadline) {
					t.Errorf("N = %v, want nil, DeadlineExceeded or ErrWaitDeadline", err)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("waiters still blocked after a minute")
	}
	if n := bad.Load(); n != 0 {
		t.Errorf("%d tries began while another of the same key was in flight", n)
	}
	if l := ls.Len(); l != 0 {
		t.Errorf("Len() = %d after every waiter left, want 0", l)
	}
	if after := goroutines(before); after > before {
		t.Errorf("%d goroutines after, %d before: some stayed behind", after, before)
	}
}

// goroutines returns the number of goroutines, once those ending (timer
// and context goroutines of the calls just returned) have had up to a
// second to go.
func goroutines(want int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 1000 && n > want; i++ {
		time.Sleep(time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// TestBlockedDuringWait: a key blocked while its caller waits (the
// limiter's try answers tierlimit.Blocked) ends the wait at once with the
// denial and ErrWaitDeadline, even without a deadline: no wait ends.
func TestBlockedDuringWait(t *testing.T) {
	var ls Lines
	blocked := tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked}
	tries := 0
	try := func() (tierlimit.Result, error) {
		tries++
		if tries == 1 {
			return tierlimit.Result{RetryAfter: time.Millisecond}, nil
		}
		return blocked, nil
	}
	got, err := ls.N(context.Background(), "k", try)
	if got != blocked || !errors.Is(err, tierlimit.ErrWaitDeadline) || tries != 2 {
		t.Errorf("N = %+v, %v after %d tries; want %+v, ErrWaitDeadline after 2", got, err, tries, blocked)
	}
}
