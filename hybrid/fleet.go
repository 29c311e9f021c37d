package hybrid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/store"
)

// The fleet: the instances of one limit beat in Redis (store.Heartbeat);
// the number alive sets each one's share of the limit while Redis is down.

// instanceID returns a random id for this instance.
func instanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// share returns an instance's share of limit in a fleet of n: Rate/n per
// Period (Rate per n·Period when n does not divide Rate) and Burst/n, at
// least 1. n instances together admit at most the limit, plus one token each
// when the burst is smaller than n.
func share(limit tierlimit.Limit, n int64) tierlimit.Limit {
	if n <= 1 {
		return limit
	}
	burst := max(1, limit.Capacity()/n)
	s := tierlimit.Limit{Rate: limit.Rate / n, Period: limit.Period, Burst: burst}
	if limit.Rate%n != 0 {
		s = tierlimit.Limit{Rate: limit.Rate, Burst: burst}
		if int64(limit.Period) <= math.MaxInt64/n {
			s.Period = limit.Period * time.Duration(n)
		}
	}
	if s.Validate() != nil {
		// Too large a fleet for an exact share: one per period each.
		s = tierlimit.Limit{Rate: 1, Period: limit.Period, Burst: 1}
	}
	return s
}

// heartbeats records this instance in the fleet every heartbeat and follows
// the fleet's size; on Close it leaves the fleet.
func (l *limiter) heartbeats() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			// Leaving is Close's: it waits for this goroutine up to
			// closeDrain, a longer wait than a beat's.
			l.beat(true, closeDrain)
			return
		case <-t.C:
			l.beat(false, max(l.cfg.callBudget, probeTimeout))
		}
	}
}

// beat sends one heartbeat (or the leaving one), waits up to wait for
// Redis's answer, and applies the count. Nobody waits on a beat, so it may
// wait longer than a decision's budget (a slower answer is still counted
// as a failed call when the budget runs out): a reply that go-redis
// retries for longer than the budget, READONLY from a replica say, then
// shows a misconfiguration rather than an outage. It beats while the
// breaker is open too, for the same reason, without telling it, as long
// as beats get answers: once one gets none, a beat would learn nothing,
// and its failed dials would put go-redis's pool in the backoff that
// delays the first call after Redis returns. While the breaker is
// half-open a beat (but the leaving one) is its probe, unless a caller's
// is in flight: a limiter no caller asks closes it once Redis answers.
func (l *limiter) beat(leave bool, wait time.Duration) error {
	send := l.call
	if st := l.brk.current(); st == tierlimit.BreakerOpen || st == tierlimit.BreakerHalfOpen && leave {
		if l.silent.Load() {
			return nil // during an outage the last count known stands
		}
		send = l.callAnyway
	}
	var n int64
	ev, err := send("heartbeat", l.cfg.callBudget, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		// Bounded by wait whatever the client's timeouts (go-redis's
		// default client waits for a stalled server its ReadTimeout):
		// New and Close wait for a beat.
		var err error
		n, err = detach.Call(l.inline, ctx, func(ctx context.Context) (int64, error) {
			n, _, err := store.Heartbeat(ctx, l.rdb, l.fleet, l.id, 3*l.cfg.heartbeat, leave)
			return n, err
		})
		return err
	})
	if err == errUnavailable {
		return nil // another probe is in flight: this beat was not sent
	}
	l.report(&ev)
	var reply redis.Error
	l.silent.Store(err != nil && !errors.As(err, &reply))
	if err != nil || leave || n < 1 {
		return err // during an outage the last count known stands
	}
	// The count is the largest of the last three beats: after Redis
	// restarts empty, or when members beat out of step, one beat may see
	// the fleet half gathered, and a share too large for an outage right
	// then is the error to avoid; an instance that left stops counting
	// three beats later.
	l.mu.Lock()
	copy(l.counts[1:], l.counts[:])
	l.counts[0] = n
	n = max(l.counts[0], l.counts[1], l.counts[2])
	l.mu.Unlock()
	l.instances.Store(n)
	if l.cfg.fallback == nil {
		s := share(l.def.base, n)
		l.share.Store(&s)
	}
	return nil
}
