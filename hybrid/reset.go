package hybrid

// Reset: forgetting a key in Redis and in process.

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
)

// Reset forgets key in Redis and in process: it is back to full capacity.
// Tokens leased for it are dropped: Redis's bucket is full again, so they
// count as refunded (or as lost if Redis could not be reached).
//
// Reset waits for Redis at most 750 ms, or until ctx ends, even while the
// circuit breaker holds decisions' calls back (a reset is asked for, not
// decided). It returns an error when Redis did not answer by then
// (wrapping context.DeadlineExceeded), when ctx ended (ctx's error), or
// when Redis failed the call: the key may then still be reset, once Redis
// runs the call it was sent.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := check.Key(key); err != nil {
		return named(err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h := keyHash(key)
	if !l.keys.enter(h) {
		return tierlimit.ErrClosed
	}
	defer l.keys.exit(h)
	var (
		gaveUp atomic.Bool
		err    error
	)
	if l.detachKey(ctx, h, answerWait, func() { err = l.reset(ctx, key, h, &gaveUp) }) {
		return named(err) // written before detach saw the work end
	}
	gaveUp.Store(true)
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("hybrid: reset: redis did not answer within %v: %w", answerWait, context.DeadlineExceeded)
}

// reset is Reset's work, under key's lock; it does nothing if its caller
// gave up before the lock was had.
func (l *limiter) reset(ctx context.Context, key string, h uint64, gaveUp *atomic.Bool) error {
	mu := l.keyLock(key)
	mu.Lock()
	defer mu.Unlock()
	if gaveUp.Load() {
		return nil
	}
	// Every entry of the key goes stale: the cached one and any that
	// ristretto dropped but that still holds tokens.
	var dropped int64
	forget := func(e *entry) {
		e.stale.Store(true)
		dropped += e.tokens.Swap(0)
		e.owed.Store(0) // the bucket is full again: nothing to charge back
		e.owedSince.Store(0)
	}
	cached, ok := l.keys.find(key, h)
	if ok {
		forget(cached)
	}
	for _, e := range l.keys.holding() {
		if e.key == key && !e.stale.Load() {
			forget(e)
		}
	}
	l.keys.del(key)
	if ok {
		l.retire(cached) // no longer in the table: ristretto's Del drops it silently
	}
	ev, err := l.callAnyway("reset", answerWait, func() error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerWait)
		defer cancel()
		return l.bucket.Reset(cctx, key)
	})
	l.report(&ev)
	if err != nil {
		l.stats.lost.Add(dropped)
		return err
	}
	l.stats.refunded.Add(dropped)
	return nil
}
