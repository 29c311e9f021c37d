package tierlimit

import (
	"context"
	"fmt"
)

// Permit is one request's place among a key's concurrent requests, given
// by a Concurrency limiter's Acquire or TryAcquire, by value: getting one
// allocates nothing. Release gives it back. Release is idempotent,
// harmless on the zero Permit, after the permit's TTL has passed and after
// the limiter's Close, and a copy's Release after the permit was released
// never releases a later holder's permit. A Permit may be copied; its
// Release is safe for concurrent use.
type Permit struct {
	r       PermitReleaser
	id, gen uint64
}

// PermitReleaser gives back the permits of a Concurrency limiter: it is
// what NewPermit's permits call.
type PermitReleaser interface {
	// ReleasePermit gives back permit id if gen is its current generation,
	// and does nothing otherwise (a permit released already, or expired,
	// whose id may now be another holder's with a later generation).
	ReleasePermit(id, gen uint64)
}

// NewPermit returns a Permit whose Release calls r.ReleasePermit(id, gen),
// for implementations of Concurrency. A nil r makes the zero Permit.
func NewPermit(r PermitReleaser, id, gen uint64) Permit {
	return Permit{r: r, id: id, gen: gen}
}

// Release gives the permit back (see Permit).
func (p Permit) Release() {
	if p.r != nil {
		p.r.ReleasePermit(p.id, p.gen)
	}
}

// Valid reports whether p is a permit, not the zero Permit.
func (p Permit) Valid() bool { return p.r != nil }

// Concurrency limits how many requests per key are in flight at once (a
// concurrent-requests limiter): at most N permits of a key are held at any
// time. remote.Concurrency, local.Concurrency and hybrid.Concurrency
// implement it; httplimit.WithConcurrency and grpclimit.WithConcurrency
// take one.
//
// Acquire waits for a permit until ctx is done and fails at once when ctx is
// already done or past its deadline, or when the key's PermitFunc answers
// NoPermits (ErrWaitDeadline). TryAcquire never waits: ok is false when the
// key has N permits out, or none at all (NoPermits). Both return an error
// only for invalid input, a done ctx, a closed limiter (ErrClosed) or, in
// the remote tier, a backend failure; a refusal is never an error.
type Concurrency interface {
	Acquire(ctx context.Context, key string) (Permit, error)
	TryAcquire(ctx context.Context, key string) (p Permit, ok bool, err error)
}

// PermitFunc gives each key its own number of permits, in place of a
// Concurrency constructor's N: 1 to MaxPermits, NoPermits (0) for a key
// that may hold none, or DefaultPermits for the constructor's N. Any other
// answer is an error wrapping ErrInvalidLimit for that call (never an
// admission). It is called on every acquisition, so it must be fast and
// safe for concurrent use.
type PermitFunc func(key string) int64

// NoPermits is what a PermitFunc returns for a key that may have no
// request in flight at all (a suspended tenant): every tier refuses its
// TryAcquire (ok false, no error; the observer sees Source SourceBlocked)
// without a call to Redis, and its Acquire returns ErrWaitDeadline at once,
// since no permit will ever be free. httplimit and grpclimit refuse such a
// request as one that found no permit free, with no Retry-After or
// RetryInfo. It is 0, so that a plan's "0 requests in flight" means none.
const NoPermits int64 = 0

// DefaultPermits is what a PermitFunc returns for a key that takes the
// Concurrency constructor's N.
const DefaultPermits int64 = -1

// MaxPermits is the largest number of permits per key a Concurrency
// limiter accepts.
const MaxPermits = 1 << 30

// CheckPermits reports whether n is a valid number of permits per key: 1 to
// MaxPermits. Its error wraps ErrInvalidLimit.
func CheckPermits(n int64) error {
	if n < 1 || n > MaxPermits {
		return fmt.Errorf("%w: %d permits per key, want 1 to %d", ErrInvalidLimit, n, int64(MaxPermits))
	}
	return nil
}

// ConcurrencyStats counts what a Concurrency limiter did since it was made.
type ConcurrencyStats struct {
	InUse    int64 // permits this limiter has given out and not yet had back
	Waiting  int64 // Acquire calls waiting for a permit now
	Acquired int64 // permits given out, by Acquire and TryAcquire
	Refused  int64 // TryAcquire calls that found no permit free
	Expired  int64 // permits Redis no longer held at a renewal: expired with their TTL (remote, hybrid)
	Fallback int64 // permits given out while Redis was down, from the instance's share (hybrid)
}
