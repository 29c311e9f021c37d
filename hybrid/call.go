package hybrid

// Calls to Redis: the call budget, the breaker-aware call with its stall
// detection and Redis's answer times, and the one lease call.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/pulse"
	"github.com/tierlimit/tierlimit/internal/store"
)

// call makes one round trip to Redis, op, through the breaker: it counts it
// in Stats and returns what to report to the observer (see report), or
// errUnavailable without calling f while the breaker holds calls back.
//
// A call over timeout is counted as failed in Stats and reported to the
// observer then, but the breaker learns of it only once Redis has been
// silent for longer than it has lately taken to answer (latency.stall):
// silent since its last answer to any call of this process's limiters on
// that server (heard), or since the call began if
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
	start, lost := time.Now(), pulse.Lost()
	// silent is how long Redis has been silent to this call, less what
	// the process itself could not run meanwhile (internal/pulse): a
	// starved process's timers fire before it reads the replies waiting
	// for it, and its own stall is not Redis's.
	silent := func(since time.Time) time.Duration {
		return time.Since(l.lastAnswer(since)) - (pulse.Lost() - lost)
	}
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
		if silent(start) >= stall && !settle(context.DeadlineExceeded) {
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
	case errors.Is(err, context.DeadlineExceeded) && silent(time.Time{}) < stall:
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

// lastAnswer returns when Redis last answered a call of this process's
// limiters (see heard), or since if that is later.
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

	mu           sync.Mutex // srtt, rttvar and samples
	srtt, rttvar time.Duration
	samples      int

	rto atomic.Int64 // srtt + 4·rttvar as of the last add, read without mu
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
	r.rto.Store(int64(r.srtt + 4*r.rttvar))
}

// stall is how long a call of that timeout may be in flight before it
// counts as failed: the timeout, and at least the floor and what Redis's
// answers have lately taken (the smoothed time plus four variations), at
// most maxStall.
func (r *latency) stall(timeout time.Duration) time.Duration {
	return max(timeout, min(max(r.floor, time.Duration(r.rto.Load())), maxStall))
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

// stallBudgets is the least time, in call budgets, a call is in flight
// before the breaker counts it as failed (see call).
const stallBudgets = 4

// probeTimeout is the least time a periodic heartbeat waits for Redis:
// nobody waits on it.
const probeTimeout = time.Second

// budget returns a context for one Redis call: ctx's values, not its
// cancellation (the call may serve other callers), and the call budget.
func (l *limiter) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), l.cfg.callBudget)
}

// expiry returns a func whose channel is closed when the call budget has
// run out, counted from its first call: every later wait sees it (a
// timer's channel would be drained by the first), and stop, which frees
// its timer.
func (l *limiter) expiry() (expiry func() <-chan struct{}, stop func()) {
	var (
		budget  *time.Timer
		expired chan struct{}
	)
	expiry = func() <-chan struct{} {
		if expired == nil {
			expired = make(chan struct{})
			budget = time.AfterFunc(l.cfg.callBudget, func() { close(expired) })
		}
		return expired
	}
	stop = func() {
		if budget != nil {
			budget.Stop()
		}
	}
	return expiry, stop
}

// leaseCall makes claim c of key in one call through the breaker, within the
// call budget (op names it in Stats and to the observer), and returns the
// tokens granted, Redis's Result, what to report (see report) and the
// call's error.
func (l *limiter) leaseCall(ctx context.Context, op, key string, c store.Claim) (granted int64, res tierlimit.Result, ev tierlimit.RedisCall, err error) {
	g, ev := l.leaseGrant(ctx, op, key, c)
	return g.Granted, g.Result, ev, g.Err
}

// leaseGrant is leaseCall, with the whole outcome (store.Grant.Full).
func (l *limiter) leaseGrant(ctx context.Context, op, key string, c store.Claim) (g store.Grant, ev tierlimit.RedisCall) {
	ev, g.Err = l.call(op, l.cfg.callBudget, func() error {
		cctx, cancel := l.budget(ctx)
		defer cancel()
		g = l.bucket.LeaseGrant(cctx, key, c)
		return g.Err
	})
	return g, ev
}
