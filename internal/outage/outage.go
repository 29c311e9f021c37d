// Package outage tells a Redis that is down or stalled from one that is
// merely slow, for a limiter that must keep deciding through an outage:
// a breaker that opens after consecutive failures and lets calls probe
// again after a probe interval, where a call over its budget counts as a
// failure only once Redis has been silent (no answer to any call of the
// limiter since the call began) for several budgets, and for longer than
// its answers lately took. A slow Redis, or a process too busy to
// read its answers in time, is not an outage: deciding as if it were
// would admit beside what Redis holds. hybrid's Limiter applies the same
// rules in its own code (hybrid/call.go, breaker.go).
package outage

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/pulse"
)

// stallBudgets is how long, in call budgets, Redis must have been silent
// for a call over its budget to count as a failure.
const stallBudgets = 4

// Guard is a breaker in front of Redis. It is safe for concurrent use.
type Guard struct {
	budget    time.Duration
	threshold int
	probe     time.Duration

	mu           sync.Mutex
	failures     int       // consecutive, since the last answer
	openUntil    time.Time // no call before, unless zero
	heard        time.Time // Redis's last answer
	closed       time.Time // when an answer last closed the open breaker
	srtt, rttvar time.Duration
	outages      uint64 // times the breaker opened
}

// maxStall bounds the silence that counts as a stall: go-redis's default
// ReadTimeout, past which the client fails the call itself.
const maxStall = 3 * time.Second

// stall is how long Redis must be silent for a call over its budget to
// count as failed: several budgets, and at least what answers lately took
// (the smoothed time and four variations, as TCP's RFC 6298), at most
// maxStall. It is called with g.mu held.
func (g *Guard) stall() time.Duration {
	return max(stallBudgets*g.budget, min(g.srtt+4*g.rttvar, maxStall))
}

// silent returns how long Redis has been silent for a call that started
// at start, less the time the process could not run meanwhile
// (internal/pulse; its user runs the beat): a starved process's own stall
// is not Redis's silence. It is called with g.mu held.
func (g *Guard) silent(now, start time.Time) time.Duration {
	since := g.heard
	if start.After(since) {
		since = start
	}
	return now.Sub(since) - pulse.LostSince(since)
}

// New returns a Guard for calls of budget that opens after threshold
// consecutive failures and probes again every probe.
func New(budget time.Duration, threshold int, probe time.Duration) *Guard {
	return &Guard{budget: budget, threshold: threshold, probe: probe, heard: time.Now()}
}

// Budget is the time one call may take.
func (g *Guard) Budget() time.Duration { return g.budget }

// Allow reports whether a call may go to Redis now: false while the
// breaker is open and not yet due for a probe.
func (g *Guard) Allow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.openUntil.IsZero() || !time.Now().Before(g.openUntil)
}

// Down reports whether Redis is taken to be out: the breaker opened and no
// call has been answered since.
func (g *Guard) Down() bool {
	down, _ := g.State()
	return down
}

// State returns Down and how many times the breaker has opened. What a
// user learned from Redis before the last opening may be stale however
// soon Redis answers again (a Redis restarted empty): it compares the
// count with the one it read when Redis last told it.
func (g *Guard) State() (down bool, outages uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failures >= g.threshold, g.outages
}

// Done records the outcome err of a call that started at start.
func (g *Guard) Done(start time.Time, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	switch {
	case answered(err):
		if g.failures >= g.threshold {
			g.closed = now
		}
		g.failures, g.openUntil, g.heard = 0, time.Time{}, now
		if d := now.Sub(start); g.srtt == 0 {
			g.srtt, g.rttvar = d, d/2
		} else {
			g.rttvar = (3*g.rttvar + (g.srtt - d).Abs()) / 4
			g.srtt = (7*g.srtt + d) / 8
		}
	case errors.Is(err, context.DeadlineExceeded) && g.silent(now, start) < g.stall():
		// Slow while Redis answers: neither way.
	default:
		g.fail(now, start)
	}
}

// Late records that a call started at start is still unanswered at its
// budget's end: a failure if Redis has been silent long enough.
func (g *Guard) Late(start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if g.silent(now, start) >= g.stall() {
		g.fail(now, start)
	}
}

// fail counts a failure of a call that started at start, unless it
// started before an answer closed the breaker: a call sent during an
// outage that fails after Redis is back (go-redis's dial retries outlast
// a restart) is news of the outage that ended, and three of them would
// open the breaker on a Redis that answers, putting the instance on its
// share beside instances leasing the whole of N (gobreaker drops such
// outcomes the same way, by generation).
func (g *Guard) fail(now, start time.Time) {
	if start.Before(g.closed) {
		return
	}
	g.failures++
	if g.failures == g.threshold {
		g.outages++
	}
	if g.failures >= g.threshold {
		g.openUntil = now.Add(g.probe)
	}
}

// answered reports whether a call that returned err got an answer from
// Redis: a reply, even an error reply, rather than a broken connection or
// a deadline.
func answered(err error) bool {
	var reply redis.Error
	var op *net.OpError
	return err == nil || (errors.As(err, &reply) && !errors.As(err, &op))
}
