package hybrid

// Bookkeeping with Redis that no caller waits for longer than a bound:
// Settle's give-backs and takes, Reset, and Close's last refunds (G4).

import (
	"context"
	"time"
)

// within runs f on a goroutine of its own and waits for it until wait has
// passed or ctx has ended; it reports whether f finished. f goes on after
// that and lands what it does for later callers: with a client that does
// not honour context deadlines, a call to a stalled Redis lasts the
// client's ReadTimeout (3 s by default), and a key lock may be held that
// long by a claim in flight, neither of which a caller should wait.
func within(ctx context.Context, wait time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// detachKey is within for work on the key of hash h by a caller inside the
// table's gate: the work stays counted inside it, so that Close waits for
// it as for a call in flight, and closes ristretto only after it.
func (l *limiter) detachKey(ctx context.Context, h uint64, wait time.Duration, f func()) bool {
	l.keys.gate.Join(h)
	return within(ctx, wait, func() {
		defer l.keys.exit(h)
		f()
	})
}

// answerWait is how long a caller that needs Redis's answer (Reset) waits
// for it: long enough for a healthy Redis on a busy machine, and within
// the bound G4 sets for Reset.
const answerWait = 750 * time.Millisecond

// closeDrain is how long Close waits for the calls in flight and the
// background goroutines before it takes the leases' tokens back, and
// closeRefund how long it then waits for its refunds: Close returns within
// their sum, whatever the calls in flight and the client's timeouts.
const (
	closeDrain  = 300 * time.Millisecond
	closeRefund = 900 * time.Millisecond
)
