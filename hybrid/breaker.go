package hybrid

// The circuit breaker in front of Redis.

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/tierlimit/tierlimit"
)

// errUnavailable is what a Redis call returns when the breaker let it not
// through. It never reaches a caller of AllowN.
var errUnavailable = errors.New("hybrid: redis unavailable: circuit breaker open")

// breaker is the circuit breaker in front of Redis: gobreaker's two-step
// breaker (Allow, then report the outcome), which opens after a number of
// consecutive failures, lets one probe through after the probe interval and
// closes when it succeeds. Errors that mean misconfiguration count neither
// way: they are not an outage. Only decisions that would call Redis ask it
// (the slow path), so its lock is not on the hot path.
type breaker struct {
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]
	opens atomic.Int64 // times it opened

	// changes carries transitions to the observer's goroutine (nil without
	// an observer), so that no user code runs under gobreaker's lock.
	changes chan tierlimit.BreakerChange
}

func newBreaker(threshold uint32, probe time.Duration, observed bool, misconfigured func(error) bool) *breaker {
	b := &breaker{}
	if observed {
		b.changes = make(chan tierlimit.BreakerChange, 64)
	}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "tierlimit-redis",
		MaxRequests: 1, // one probe at a time while half-open
		Timeout:     probe,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= threshold
		},
		OnStateChange: b.changed,
		// A misconfiguration is not an outage, and a slow call while
		// Redis answers is neither a success nor a failure.
		IsExcluded: func(err error) bool { return err == errSlow || misconfigured(err) },
	})
	return b
}

// changed is gobreaker's OnStateChange; it runs under gobreaker's lock.
func (b *breaker) changed(_ string, from, to gobreaker.State) {
	if to == gobreaker.StateOpen {
		b.opens.Add(1)
	}
	if b.changes != nil {
		select {
		case b.changes <- tierlimit.BreakerChange{From: breakerState(from), To: breakerState(to)}:
		default: // the observer is behind: Stats still counts the opens
		}
	}
}

func breakerState(s gobreaker.State) tierlimit.BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return tierlimit.BreakerOpen
	case gobreaker.StateHalfOpen:
		return tierlimit.BreakerHalfOpen
	}
	return tierlimit.BreakerClosed
}

// allow returns a func to report one Redis call's outcome, or
// errUnavailable if no call may go to Redis now.
func (b *breaker) allow() (func(error), error) {
	done, err := b.cb.Allow()
	if err != nil {
		return nil, errUnavailable
	}
	return done, nil
}

// open reports whether the breaker is open and not yet due for a probe.
func (b *breaker) open() bool { return b.cb.State() == gobreaker.StateOpen }

// current returns the breaker's state (an open breaker due for a probe is
// half-open).
func (b *breaker) current() tierlimit.BreakerState {
	return breakerState(b.cb.State())
}

// stalled tells the breaker of one more failure: a call still in flight,
// Redis still silent. While the breaker is open (or its probe is under
// way) there is nothing to tell.
func (b *breaker) stalled() {
	if done, err := b.cb.Allow(); err == nil {
		done(context.DeadlineExceeded)
	}
}

// notify delivers breaker changes to the observer until Close.
func (l *limiter) notify(f func(tierlimit.BreakerChange)) {
	defer l.wg.Done()
	for {
		select {
		case <-l.done:
			return
		case c := <-l.brk.changes:
			f(c)
		}
	}
}
