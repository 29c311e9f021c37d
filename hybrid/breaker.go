package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

func newBreaker(threshold uint32, probe time.Duration, observed bool) *breaker {
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
		IsExcluded:    tierlimit.Misconfigured,
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

// call makes one round trip to Redis, op, through the breaker: it counts it
// in Stats and returns what to report to the observer (see report), or
// errUnavailable without calling f while the breaker holds calls back.
//
// The breaker learns that the call failed once timeout has passed, even if
// f is still running: the client may be retrying dials with its own backoff
// (go-redis: DialerRetries × DialerRetryTimeout, 500 ms by default), and a
// breaker that waited for it would open, and heal, that much later. It
// learns of one more failure for every further timeout the call is still
// in flight: a stalled Redis with one call in flight per key (a paused
// server, say) opens the breaker within a few budgets, and decisions stop
// waiting on it.
func (l *Limiter) call(op string, timeout time.Duration, f func() error) (tierlimit.RedisCall, error) {
	done, err := l.brk.allow()
	if err != nil {
		return tierlimit.RedisCall{}, err
	}
	return l.run(op, timeout, done, l.brk.stalled, f)
}

// callAnyway makes the call even while the breaker holds calls back, and
// does not report to it: Close's last refunds, which have no later chance.
func (l *Limiter) callAnyway(op string, timeout time.Duration, f func() error) (tierlimit.RedisCall, error) {
	return l.run(op, timeout, func(error) {}, func() {}, f)
}

// stalled tells the breaker of one more failure: a call still in flight a
// budget after its first one ran out. While the breaker is open (or its
// probe is under way) there is nothing to tell.
func (b *breaker) stalled() {
	if done, err := b.cb.Allow(); err == nil {
		done(context.DeadlineExceeded)
	}
}

// run makes the call f and settles it with done (see call). A call that
// runs past its budget is counted as failed when the budget runs out, in
// the breaker, Stats and the observer alike, whenever it ends; it is
// reported once. stalled is called at every further budget it runs.
func (l *Limiter) run(op string, timeout time.Duration, done func(error), stalled func(), f func() error) (tierlimit.RedisCall, error) {
	var once sync.Once
	settle := func(err error) (first bool) {
		once.Do(func() { first = true; done(err) })
		return first
	}
	var (
		mu       sync.Mutex // orders the timer's re-arming with the call's end
		finished bool
		late     *time.Timer
	)
	expire := func() {
		if settle(context.DeadlineExceeded) {
			l.stats.redisErrors.Add(1)
			if l.onCall != nil {
				err := fmt.Errorf("hybrid: %s: redis call over its %v budget: %w", op, timeout, context.DeadlineExceeded)
				l.onCall(tierlimit.RedisCall{Op: op, Latency: timeout, Err: err})
			}
		} else {
			stalled()
		}
		mu.Lock()
		if !finished {
			late.Reset(timeout)
		}
		mu.Unlock()
	}
	mu.Lock()
	late = time.AfterFunc(timeout, expire)
	mu.Unlock()
	var start time.Time
	if l.onCall != nil {
		start = time.Now()
	}
	err := f()
	mu.Lock()
	finished = true
	late.Stop()
	mu.Unlock()
	l.stats.redisCalls.Add(1)
	l.learn(err)
	if !settle(err) {
		return tierlimit.RedisCall{}, err // counted and reported when the budget ran out
	}
	if err != nil {
		l.stats.redisErrors.Add(1)
	}
	if l.onCall == nil {
		return tierlimit.RedisCall{}, err
	}
	return tierlimit.RedisCall{Op: op, Latency: time.Since(start), Err: err}, err
}

// learn remembers whether a call's outcome err means a misconfiguration:
// set by a reply that does, cleared by a success (see Limiter.misconfig).
func (l *Limiter) learn(err error) {
	switch {
	case err == nil:
		if l.misconfig.Load() != nil {
			l.misconfig.Store(nil)
		}
	case tierlimit.Misconfigured(err):
		err = fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err)
		l.misconfig.Store(&err)
	}
}

// report gives a call's event to the observer. Callers defer it ahead of
// their locks, so that no user code runs under a lock.
func (l *Limiter) report(ev *tierlimit.RedisCall) {
	if l.onCall != nil && ev.Op != "" {
		l.onCall(*ev)
	}
}

// notify delivers breaker changes to the observer until Close.
func (l *Limiter) notify(f func(tierlimit.BreakerChange)) {
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
