package hybrid

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestBreakerSteps walks the breaker through its states on synctest's
// clock: it opens after the threshold of consecutive failures, holds calls
// back for the probe interval, lets one probe through, and closes when the
// probe succeeds (or opens again when it fails). A misconfiguration counts
// neither way.
func TestBreakerSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const probe = 500 * time.Millisecond
		b := newBreaker(3, probe, false, tierlimit.Misconfigured)
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
		time.Sleep(probe - time.Millisecond)
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
