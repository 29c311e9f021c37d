package remote

import (
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// TokenBucket is a token bucket in Redis: Burst tokens, refilled at Rate
// per Period, exact in integer arithmetic. The hybrid tier leases its
// tokens from the same buckets. Settle may take a key into debt, down to
// minus its capacity: it is denied until the refill has repaid it.
//
// A TokenBucket is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type TokenBucket struct{ *limiter }

// NewTokenBucket returns a TokenBucket enforcing limit (and any
// WithLimits). Errors are as for NewGCRA.
func NewTokenBucket(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*TokenBucket, error) {
	l, err := newLimiter("remote.NewTokenBucket", rdb, store.TokenBucket, limit, opts)
	if err != nil {
		return nil, err
	}
	return &TokenBucket{l}, nil
}

// GCRA is a generic cell rate algorithm limiter in Redis: one value per key
// (the theoretical arrival time, in µs and a remainder, so that the
// emission interval Period/Rate is exact). It admits exactly what a token
// bucket of the same limit admits, debt included: Settle may move the
// theoretical arrival time past now + tolerance, down to a level of minus
// the capacity.
//
// A GCRA is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type GCRA struct{ *limiter }

// NewGCRA returns a GCRA limiter enforcing limit (and any WithLimits).
// It returns an error wrapping tierlimit.ErrInvalidLimit for a bad limit and
// tierlimit.ErrInvalidOption for a nil client (a typed nil *redis.Client or
// *redis.ClusterClient too) or a bad option. It returns an error wrapping
// tierlimit.ErrMisconfigured for a client that does not fit its server (a
// plain client on a Cluster node, a Cluster client on a standalone
// server), and when a live limiter of this process, of any tier, keeps
// the same keys (the same algorithm, hybrid.New being a token bucket,
// under the same prefix on the same server) under another limit at a
// position both use (the constructor's limit, then WithLimits' in order):
// each would rewrite the other's state under its own limit. A limiter the
// program dropped gives its place up (docs/operations.md).
//
// Every constructor of the package makes one call to Redis, a reading of
// its eviction settings (Eviction), and waits for it at most NewTimeout,
// whatever the client's dial timeouts and retries. A Redis that does not
// answer by then is not an error: it is logged (log/slog) in plain words,
// and the limiter's calls return Redis's errors until it answers.
func NewGCRA(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*GCRA, error) {
	l, err := newLimiter("remote.NewGCRA", rdb, store.GCRA, limit, opts)
	if err != nil {
		return nil, err
	}
	return &GCRA{l}, nil
}

// FixedWindow counts events in fixed windows of one Period aligned on the
// Unix epoch: at most Rate per window, so up to 2·Rate may pass within one
// Period across a window boundary. A denied request may retry when its
// window ends. Burst must be 0 (or Rate). A window keeps no debt: Settle
// takes at most what the window still admits.
//
// A FixedWindow is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type FixedWindow struct{ *limiter }

// NewFixedWindow returns a FixedWindow limiter enforcing limit (and any
// WithLimits). Errors are as for NewGCRA.
func NewFixedWindow(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*FixedWindow, error) {
	l, err := newLimiter("remote.NewFixedWindow", rdb, store.FixedWindow, limit, opts)
	if err != nil {
		return nil, err
	}
	return &FixedWindow{l}, nil
}

// AnchoredWindow counts events in a window that opens at a key's first
// admitted event and lasts one Period: at most Rate per window. A denied
// request is told the time left until its window ends. Burst must be 0
// (or Rate). A window keeps no debt: Settle takes at most what the window
// still admits.
//
// An AnchoredWindow is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type AnchoredWindow struct{ *limiter }

// NewAnchoredWindow returns an AnchoredWindow limiter enforcing limit (and
// any WithLimits). Errors are as for NewGCRA.
func NewAnchoredWindow(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*AnchoredWindow, error) {
	l, err := newLimiter("remote.NewAnchoredWindow", rdb, store.AnchoredWindow, limit, opts)
	if err != nil {
		return nil, err
	}
	return &AnchoredWindow{l}, nil
}

// SlidingLog keeps a sorted set of the admitted events of the last Period:
// exactly at most Rate in any window of one Period. It costs memory in
// Redis for every admitted request (O(Rate) per key): NewSlidingLog refuses
// a Rate above 1,000,000 (about 100 MB per key); prefer SlidingWindow or
// TokenBucket for large rates. Burst must be 0 (or Rate). The log keeps no
// debt: Settle adds at most what the window still admits.
//
// A SlidingLog is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type SlidingLog struct{ *limiter }

// NewSlidingLog returns a SlidingLog limiter enforcing limit (and any
// WithLimits). Errors are as for NewGCRA.
func NewSlidingLog(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*SlidingLog, error) {
	l, err := newLimiter("remote.NewSlidingLog", rdb, store.SlidingLog, limit, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingLog{l}, nil
}

// SlidingWindow approximates a sliding window with two counters: the current
// fixed window's and the previous one's, weighted by how much of it the
// sliding window still covers (it assumes the previous window's events were
// evenly spread). Constant memory per key; never more than Rate in one
// fixed window. Burst must be 0 (or Rate). It keeps no debt: Settle adds
// at most what the window still admits.
//
// A SlidingWindow is safe for concurrent use.
// Its methods are Allow, AllowN, AllowAtMost, AllowAll, WaitN, Settle,
// LimitFor and Reset.
type SlidingWindow struct{ *limiter }

// NewSlidingWindow returns a SlidingWindow limiter enforcing limit (and any
// WithLimits). Errors are as for NewGCRA.
func NewSlidingWindow(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*SlidingWindow, error) {
	l, err := newLimiter("remote.NewSlidingWindow", rdb, store.SlidingWindow, limit, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingWindow{l}, nil
}
