// Package permit holds what the concurrency limiters of every tier share:
// the input rules (a key, its number of permits, a ctx that is already
// done), their counters, and a queue of waiters per key, woken one at a
// time. Its errors name no package: the public package that returns them
// names itself (check.Named).
package permit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Limit checks key and returns its number of permits: fn's answer for it,
// 0 for a key fn blocks (tierlimit.NoPermits), or def when fn is nil or
// answers tierlimit.DefaultPermits. A key error wraps
// tierlimit.ErrInvalidKey, any other answer outside 1 to
// tierlimit.MaxPermits tierlimit.ErrInvalidLimit.
func Limit(key string, def int64, fn tierlimit.PermitFunc) (int64, error) {
	if err := check.Key(key); err != nil {
		return 0, fmt.Errorf("%w (key %q)", err, trim(key))
	}
	if fn == nil {
		return def, nil
	}
	switch n := fn(key); n {
	case tierlimit.DefaultPermits:
		return def, nil
	case tierlimit.NoPermits:
		return 0, nil
	default:
		if err := tierlimit.CheckPermits(n); err != nil {
			return 0, fmt.Errorf("%w from the permit func (key %q)", err, key)
		}
		return n, nil
	}
}

// Blocked reports a refusal of a key its permit func blocks (n is 0) to
// s and onPermit, and returns TryAcquire's answer for it; Acquire returns
// tierlimit.ErrWaitDeadline instead.
func Blocked(s *Stats, onPermit func(tierlimit.PermitDecision)) (tierlimit.Permit, bool, error) {
	s.Refused.Add(1)
	Report(onPermit, false, tierlimit.SourceBlocked, 0)
	return tierlimit.Permit{}, false, nil
}

// trim shortens a key for an error message.
func trim(key string) string {
	if len(key) > 64 {
		return key[:64] + "..."
	}
	return key
}

// Ready returns ctx's error if it is done, or context.DeadlineExceeded if
// its deadline has passed (before the runtime's timer says so): an Acquire
// that could never wait fails at once.
func Ready(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", tierlimit.ErrInvalidOption)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// Stats are a limiter's counters. The zero value is ready; it is safe for
// concurrent use.
type Stats struct {
	InUse, Waiting, Acquired, Refused, Expired atomic.Int64
}

// Read returns the counters.
func (s *Stats) Read() tierlimit.ConcurrencyStats {
	return tierlimit.ConcurrencyStats{
		InUse: s.InUse.Load(), Waiting: s.Waiting.Load(), Acquired: s.Acquired.Load(),
		Refused: s.Refused.Load(), Expired: s.Expired.Load(),
	}
}

// Queue holds each key's waiters in arrival order, so that a permit given
// back in this process wakes the longest waiter first. Keys without
// waiters take no memory. The zero value is ready; it is safe for
// concurrent use.
type Queue struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

// Join adds a waiter for key and returns the channel its wake-up arrives
// on (buffered: a wake-up is never lost). The waiter must Leave.
func (q *Queue) Join(key string) chan struct{} {
	ch := make(chan struct{}, 1)
	q.mu.Lock()
	if q.m == nil {
		q.m = make(map[string][]chan struct{})
	}
	q.m[key] = append(q.m[key], ch)
	q.mu.Unlock()
	return ch
}

// Leave takes waiter ch of key out of the queue. A wake-up it received
// and did not use is passed to the next waiter.
func (q *Queue) Leave(key string, ch chan struct{}) {
	q.mu.Lock()
	ws := q.m[key]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(q.m, key)
	} else {
		q.m[key] = ws
	}
	q.mu.Unlock()
	select {
	case <-ch:
		q.Wake(key)
	default:
	}
}

// Wake wakes the longest waiter of key, if any, that is not woken yet.
func (q *Queue) Wake(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.m[key] {
		select {
		case w <- struct{}{}:
			return
		default: // woken already and not yet running
		}
	}
}

// Report gives f, if not nil, one acquisition's outcome.
func Report(f func(tierlimit.PermitDecision), acquired bool, src tierlimit.Source, waited time.Duration) {
	if f != nil {
		f(tierlimit.PermitDecision{Acquired: acquired, Source: src, Waited: waited})
	}
}

// The polling of a waiter whose key has no permit free in Redis: the first
// wait and the longest, each drawn at random between half and all of the
// bound, the bound doubling from the first to the longest (PollMax).
const (
	pollFirst = 2 * time.Millisecond
	PollMax   = 50 * time.Millisecond
)

// Poll is remote's and hybrid's Acquire: it calls try at once, then, as a
// waiter of key in q (counted in s.Waiting), again at each wake-up (a
// permit given back in this process) and each poll, until try returns a
// permit (ok) or an error, ctx ends (its error) or done closes
// (tierlimit.ErrClosed). It reports the outcome to onPermit (nil: none)
// with the time waited: 0 for a permit free at once.
func (q *Queue) Poll(ctx context.Context, key string, s *Stats, done <-chan struct{}, onPermit func(tierlimit.PermitDecision),
	try func() (p tierlimit.Permit, ok bool, src tierlimit.Source, err error)) (tierlimit.Permit, error) {
	start := time.Now()
	// gaveUp reports an Acquire whose ctx ended during a call to Redis as
	// one that gave up waiting, as when it ends between calls.
	gaveUp := func(err error) {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			Report(onPermit, false, tierlimit.SourceRemote, time.Since(start))
		}
	}
	if p, ok, src, err := try(); err != nil || ok {
		if ok {
			Report(onPermit, true, src, 0)
		}
		gaveUp(err)
		return p, err
	}
	woken := q.Join(key)
	defer q.Leave(key, woken)
	s.Waiting.Add(1)
	defer s.Waiting.Add(-1)
	bound := pollFirst
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(bound/2 + rand.N(bound/2+1))
		bound = min(2*bound, PollMax)
		select {
		case <-woken:
		case <-timer.C:
		case <-ctx.Done():
			Report(onPermit, false, tierlimit.SourceRemote, time.Since(start))
			return tierlimit.Permit{}, ctx.Err()
		case <-done:
			return tierlimit.Permit{}, tierlimit.ErrClosed
		}
		if p, ok, src, err := try(); err != nil || ok {
			if ok {
				Report(onPermit, true, src, time.Since(start))
			}
			gaveUp(err)
			return p, err
		}
	}
}
