// Package tierlimit is the shared vocabulary of a distributed rate limiter
// built in tiers: [Limit], [Result], [Source], the [Limiter] interface and the
// errors every tier returns.
//
// The limiters themselves live in sub-packages:
//
//   - remote: exact limiters whose state lives in Redis, one Lua call per
//     decision (token bucket, GCRA, fixed, anchored and sliding windows, and
//     a sliding log);
//   - local: in-process per-key token buckets (golang.org/x/time/rate's,
//     in exact integer arithmetic) in a bounded cache;
//   - hybrid: token batches leased from the Redis token bucket and spent
//     locally, so most decisions make no round trip while the fleet never
//     admits more than one Redis bucket would.
//
// Each tier also limits requests in flight per key: [Concurrency], whose
// [Permit] a caller releases when done (remote.NewConcurrency,
// local.NewConcurrency, hybrid.NewConcurrency).
//
// A denial is a [Result] whose Allowed field is false, never an error. Errors
// mean bad input (errors.Is with [ErrInvalidLimit], [ErrInvalidKey],
// [ErrInvalidCost], [ErrInvalidOption]), a cancelled context, a closed
// limiter ([ErrClosed]) or, for the remote tier only, a failing backend.
package tierlimit
