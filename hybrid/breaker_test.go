package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/pulse/pulsetest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestBreakerSteps walks the breaker through its states on synctest's
// clock: it opens after the threshold of consecutive failures, holds calls
// back for the probe interval, lets one probe through, and closes when the
// probe succeeds (or opens again when it fails). A misconfiguration counts
// neither way.
func TestBreakerSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const probe = 500 * time.Millisecond
		b := newBreaker(3, probe, tierlimit.Misconfigured)
		outage := errors.New("ERR injected outage")
		call := func(err error) error {
			done, aerr := b.allow()
			if aerr != nil {
				return aerr
			}
			done(err)
			return nil
		}
		expect := func(step string, want tierlimit.BreakerState) {
			t.Helper()
			// open answers from its own deadline, before gobreaker's
			// (which current, asked first, would move past).
			if got := b.open(); got != (want == tierlimit.BreakerOpen) {
				t.Fatalf("%s: open() = %v, want it with the breaker %v", step, got, want)
			}
			if got := b.current(); got != want {
				t.Fatalf("%s: breaker %v, want %v", step, got, want)
			}
		}
		for i := range 2 {
			if err := call(outage); err != nil {
				t.Fatalf("failure %d let through = %v, want nil", i, err)
			}
		}
		if err := call(errors.New("NOPERM no permissions")); err != nil {
			t.Fatal(err)
		}
		expect("2 failures and a misconfiguration", tierlimit.BreakerClosed)
		call(outage)
		expect("3 consecutive failures", tierlimit.BreakerOpen)
		if !b.open() || call(nil) != errUnavailable {
			t.Fatal("an open breaker let a call through")
		}
		time.Sleep(probe / 2)
		expect("half the probe interval", tierlimit.BreakerOpen)
		time.Sleep(probe/2 - time.Millisecond)
		expect("just before the probe interval", tierlimit.BreakerOpen)
		time.Sleep(time.Millisecond + 1)
		expect("past the probe interval", tierlimit.BreakerHalfOpen)
		// One probe at a time: a second call waits for the first's verdict.
		done, err := b.allow()
		if err != nil {
			t.Fatalf("the probe = %v, want let through", err)
		}
		if _, err := b.allow(); err != errUnavailable {
			t.Fatalf("a second call during the probe = %v, want errUnavailable", err)
		}
		done(outage)
		expect("a failed probe", tierlimit.BreakerOpen)
		time.Sleep(probe + 1)
		if err := call(nil); err != nil {
			t.Fatalf("the next probe = %v", err)
		}
		expect("a probe that succeeded", tierlimit.BreakerClosed)
		if got := b.opens.Load(); got != 2 {
			t.Errorf("opens = %d, want 2", got)
		}
	})
}

// TestStoppedProcessIsNotAnOutage stops this whole process 3 times for 400 ms (a
// starved CPU, a suspended VM) while its callers claim from a healthy
// Redis, with default options and go-redis's default client: when it runs
// again, its calls' timers fire before it reads the replies waiting for
// it, and the process's own stall must not open the breaker (G1: the
// fallback would admit beside the other instances' leases).
func TestStoppedProcessIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	l, err := New(rdb, tierlimit.PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	stopped(t, func(g, i int) {
		l.Allow(ctx, fmt.Sprint("k", g, ":", i%500)) // many keys of a small limit: most calls claim
	})
	if s := l.Stats(); s.BreakerOpens != 0 {
		t.Errorf("the breaker opened %d times while Redis answered; stats %+v", s.BreakerOpens, s)
	}
}

// stopped runs work(g, i) in 8 goroutines (g), call after call (i), while
// this process is stopped 3 times for 400 ms (the timers of one stop do
// not always fire before the replies waiting are read), and until 300 ms
// after the last.
func stopped(t *testing.T, work func(g, i int)) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				work(g, i)
			}
		})
	}
	for range 3 {
		time.Sleep(300 * time.Millisecond)
		pulsetest.StopSelf(t, 400*time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
}
