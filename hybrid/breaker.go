package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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

// call makes one round trip to Redis, op, through the breaker: it counts it
// in Stats and returns what to report to the observer (see report), or
// errUnavailable without calling f while the breaker holds calls back.
//
// A call over timeout is counted as failed in Stats and reported to the
// observer then, but the breaker learns of it only once Redis has been
// silent for longer than it has lately taken to answer (latency.stall):
// silent since its last answer to any call, or since the call began if
// that is later. A Redis that answers slowly, or a process too busy to
// read its answers in time, is not an outage, and opening the breaker
// there would let the fallback admit beside the leases (G1). A silent
// Redis tells the breaker of one failure then, and of one more for every
// further timeout the call is still in flight: with one call in flight per
// key (a paused server, say) the breaker opens within a few budgets of
// the stall, whatever the client does meanwhile (go-redis retries dials
// with its own backoff: DialerRetries × DialerRetryTimeout, 500 ms by
// default). A call the client ends at its deadline (ContextTimeoutEnabled)
// counts as failed only if Redis has been silent that long.
func (l *limiter) call(op string, timeout time.Duration, f func() error) (tierlimit.RedisCall, error) {
	done, err := l.brk.allow()
	if err != nil {
		return tierlimit.RedisCall{}, err
	}
	return l.run(op, timeout, done, l.brk.stalled, f)
}

// callAnyway makes the call even while the breaker holds calls back, and
// does not report to it: Close's last refunds, which have no later chance.
func (l *limiter) callAnyway(op string, timeout time.Duration, f func() error) (tierlimit.RedisCall, error) {
	return l.run(op, timeout, func(error) {}, func() {}, f)
}

// stalled tells the breaker of one more failure: a call still in flight,
// Redis still silent. While the breaker is open (or its probe is under
// way) there is nothing to tell.
func (b *breaker) stalled() {
	if done, err := b.cb.Allow(); err == nil {
		done(context.DeadlineExceeded)
	}
}

// errSlow settles with the breaker a call that ended at its deadline while
// Redis was answering: it counts neither way.
var errSlow = errors.New("hybrid: redis call over its budget while redis answers")

// run makes the call f and settles it with done (see call): at its end, or
// as failed once Redis has been silent too long, whichever comes first;
// stalled is called at every further timeout it runs in silence.
func (l *limiter) run(op string, timeout time.Duration, done func(error), stalled func(), f func() error) (tierlimit.RedisCall, error) {
	var once sync.Once
	settle := func(err error) (first bool) {
		once.Do(func() { first = true; done(err) })
		return first
	}
	stall := l.rtt.stall(timeout)
	start := time.Now()
	var (
		mu       sync.Mutex // orders the timer's ticks with the call's end
		finished bool
		late     bool // the call ran past its timeout
		tick     *time.Timer
	)
	onTick := func() {
		mu.Lock()
		if finished {
			mu.Unlock()
			return
		}
		first := !late
		late = true
		tick.Reset(timeout)
		mu.Unlock()
		if first {
			l.stats.redisErrors.Add(1)
			if l.onCall != nil {
				err := fmt.Errorf("hybrid: %s: redis call over its %v budget: %w", op, timeout, context.DeadlineExceeded)
				l.onCall(tierlimit.RedisCall{Op: op, Latency: timeout, Err: err})
			}
		}
		if time.Since(l.lastAnswer(start)) >= stall && !settle(context.DeadlineExceeded) {
			stalled()
		}
	}
	mu.Lock()
	tick = time.AfterFunc(timeout, onTick)
	mu.Unlock()
	err := f()
	took := time.Since(start)
	mu.Lock()
	finished = true
	tick.Stop()
	counted := late
	mu.Unlock()
	l.stats.redisCalls.Add(1)
	l.learn(err)
	switch {
	case answered(err):
		l.answered.Store(time.Now().UnixNano())
		l.rtt.add(took)
		settle(err)
	case errors.Is(err, context.DeadlineExceeded) && time.Since(l.lastAnswer(time.Time{})) < stall:
		settle(errSlow)
	default:
		settle(err)
	}
	if counted {
		return tierlimit.RedisCall{}, err // counted and reported when the budget ran out
	}
	if err != nil {
		l.stats.redisErrors.Add(1)
	}
	if l.onCall == nil {
		return tierlimit.RedisCall{}, err
	}
	return tierlimit.RedisCall{Op: op, Latency: took, Err: err}, err
}

// lastAnswer returns when Redis last answered a call of l, or since if
// that is later.
func (l *limiter) lastAnswer(since time.Time) time.Time {
	if at := time.Unix(0, l.answered.Load()); at.After(since) {
		return at
	}
	return since
}

// answered reports whether a call that returned err got an answer from
// Redis: a reply, even an error reply, rather than a broken connection or
// a deadline.
func answered(err error) bool {
	var reply redis.Error
	return err == nil || errors.As(err, &reply)
}

// latency follows how long Redis takes to answer this limiter's calls, as
// TCP follows a round trip (RFC 6298): a smoothed time and its variation.
// It is safe for concurrent use.
type latency struct {
	floor time.Duration // the least stall: a few call budgets

	mu           sync.Mutex
	srtt, rttvar time.Duration
	samples      int
}

// maxStall bounds a stall: go-redis's default ReadTimeout, past which the
// client fails the call itself.
const maxStall = 3 * time.Second

// add records the time one call took to be answered.
func (r *latency) add(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.samples == 0 {
		r.srtt, r.rttvar = d, d/2
	} else {
		r.rttvar = (3*r.rttvar + (r.srtt - d).Abs()) / 4
		r.srtt = (7*r.srtt + d) / 8
	}
	r.samples++
}

// stall is how long a call of that timeout may be in flight before it
// counts as failed: the timeout, and at least the floor and what Redis's
// answers have lately taken (the smoothed time plus four variations), at
// most maxStall.
func (r *latency) stall(timeout time.Duration) time.Duration {
	r.mu.Lock()
	rto := r.srtt + 4*r.rttvar
	r.mu.Unlock()
	return max(timeout, min(max(r.floor, rto), maxStall))
}

// learn remembers whether a call's outcome err means a misconfiguration:
// set by a reply that does, cleared by a success (see Limiter.misconfig).
func (l *limiter) learn(err error) {
	switch {
	case err == nil:
		if l.misconfig.Load() != nil {
			l.misconfig.Store(nil)
		}
	case l.bucket.Misconfigured(err):
		err = fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err)
		l.misconfig.Store(&err)
	}
}

// report gives a call's event to the observer. Callers defer it ahead of
// their locks, so that no user code runs under a lock.
func (l *limiter) report(ev *tierlimit.RedisCall) {
	if l.onCall != nil && ev.Op != "" {
		l.onCall(*ev)
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
