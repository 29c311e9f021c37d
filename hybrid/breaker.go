package hybrid

// The circuit breaker in front of Redis.

import (
	"context"
	"errors"
	"log/slog"
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
// (the slow path), so its lock is not on the hot path; while it is open,
// every decision that its key's lease cannot make asks it, and open reads
// an atomic instead (BenchmarkAllowOutage).
type breaker struct {
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]
	probe time.Duration
	start time.Time    // mono's origin
	opens atomic.Int64 // times it opened

	// openUntil is, while the breaker is open, a time (ns of mono) before
	// gobreaker's own end of the open state, when the probe becomes due;
	// 0 otherwise.
	openUntil atomic.Int64

	// changes carries transitions to the observer's goroutine (nil without
	// an observer), so that no user code runs under gobreaker's lock.
	changes chan tierlimit.BreakerChange
}

func newBreaker(threshold uint32, probe time.Duration, misconfigured func(error) bool) *breaker {
	b := &breaker{probe: probe, start: time.Now(), changes: make(chan tierlimit.BreakerChange, 64)}
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
		// gobreaker read its clock before calling changed: ending a
		// millisecond early keeps openUntil before its end.
		b.openUntil.Store(b.mono() + int64(b.probe-openMargin))
	} else {
		b.openUntil.Store(0)
	}
	select {
	case b.changes <- tierlimit.BreakerChange{From: breakerState(from), To: breakerState(to)}:
	default: // the log and the observer are behind: Stats still counts the opens
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
// Until openUntil it is, without gobreaker's lock and clock; after it,
// gobreaker says (and moves to half-open when the probe is due).
func (b *breaker) open() bool {
	if b.mono() < b.openUntil.Load() {
		return true
	}
	return b.cb.State() == gobreaker.StateOpen
}

// openMargin is how much earlier than gobreaker the breaker stops reading
// its open state from openUntil.
const openMargin = time.Millisecond

// mono returns the time in ns since the breaker was made, on the clock
// gobreaker reads (time.Now's): at least 0, as openUntil's zero.
func (b *breaker) mono() int64 { return int64(time.Since(b.start)) }

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

// notify logs breaker changes and delivers them to the observer's f (nil:
// none) until Close, off gobreaker's lock and the callers' goroutines.
func (l *limiter) notify(f func(tierlimit.BreakerChange)) {
	defer l.wg.Done()
	var since time.Time // when the breaker left closed
	var opens int
	for {
		select {
		case <-l.done:
			// The changes made before Close are logged and delivered.
			for {
				select {
				case c := <-l.brk.changes:
					since, opens = l.logBreaker(c, since, opens)
					if f != nil {
						f(c)
					}
				default:
					return
				}
			}
		case c := <-l.brk.changes:
			since, opens = l.logBreaker(c, since, opens)
			if f != nil {
				f(c)
			}
		}
	}
}

// logBreaker logs change c: an outage's start (closed to open) as a
// warning and its end (to closed) as information, with how long it lasted
// and how often the breaker opened; the probes between (open to half-open
// and back) at debug level, so that an outage of minutes logs two lines,
// not two a probe interval. since and opens are the outage's so far; it
// returns them updated.
func (l *limiter) logBreaker(c tierlimit.BreakerChange, since time.Time, opens int) (time.Time, int) {
	log := l.cfg.logger
	if log == nil {
		log = slog.Default()
	}
	if c.To == tierlimit.BreakerOpen {
		opens++
	}
	switch {
	case c.From == tierlimit.BreakerClosed && c.To == tierlimit.BreakerOpen:
		since = time.Now()
		log.Warn("hybrid: Redis is not answering: circuit breaker open, deciding on the fallback until it answers",
			"prefix", l.cfg.prefix, "fallback", l.share.Load().String(), "probe_interval", l.cfg.probeInterval)
	case c.To == tierlimit.BreakerClosed:
		log.Info("hybrid: Redis answers again: circuit breaker closed, leasing resumed",
			"prefix", l.cfg.prefix, "outage", time.Since(since).Round(time.Millisecond), "breaker_opens", opens)
		since, opens = time.Time{}, 0
	default:
		log.Debug("hybrid: circuit breaker "+c.To.String(), "prefix", l.cfg.prefix, "from", c.From.String())
	}
	return since, opens
}
