// Package hybrid is a distributed rate limiter that decides most requests in
// process while the fleet never admits more than one Redis token bucket.
//
// An instance leases batches of tokens from the Redis token bucket (package
// remote) with one Lua call: tokens are debited in Redis before they are
// spent locally. A ledger beside the bucket records what each instance
// still holds, and the bucket refills only what the leases leave: over any
// interval the fleet admits at most what one bucket allows (docs/design.md,
// G1, with its two exceptions; with WithLimits, for every limit). A
// [Limiter] decides, for each AllowN:
//
//  1. Lease: if the key holds a local lease with n tokens, take them with an
//     atomic operation and allow (Source local). No clock read, no allocation.
//  2. Known-blocked: if Redis recently had no tokens for the key, deny locally
//     until the tokens it needs can have accrued (Source blocked).
//  3. Otherwise claim a lease from Redis: between n and the lease size, in one
//     call that concurrent callers of the key share (Source remote).
//
// A hot key's lease is refilled in the background when it runs low, so its
// callers do not wait for Redis. The lease size follows the key's local
// demand (about one refill interval of it), bounded by WithLeaseBounds and
// capped relative to the burst; tiny limits lease exactly what each call
// asks (exact mode). Unspent tokens go back to Redis (a pipelined refund)
// when a lease expires, is evicted from the bounded cache, on Reset and on
// Close; Stats keeps the ledger leased = spent + refunded + lost + held.
//
// When Redis fails or is slow, no decision waits longer than the call budget
// (WithCallBudget) and no Redis error reaches the caller. A Redis that
// answers past the budget, within about what its answers have lately
// taken (at most 3 s), is not an outage. A silent one opens a circuit
// breaker (WithBreakerThreshold, WithProbeInterval) that stops calling
// Redis; leases held are spent first, and the failure mode decides the rest
// (WithFailureMode): by default a token bucket per key (x/time/rate's, in
// exact integers) at this instance's share of the limit, the live
// instances being counted in Redis by a heartbeat (WithHeartbeat,
// WithFallback). A key's bucket starts from what Redis last said the key
// had (nothing for a key this instance never claimed), and what it admits
// is charged to Redis when it answers again. A call that is only slow, while the breaker is closed,
// mints no tokens: the key is denied for a budget's time. Probes close the breaker
// when Redis answers, and leasing resumes by itself. Redis refusing the
// limiter's commands (see tierlimit.Misconfigured: a password, an ACL
// permission, a renamed command, a read-only replica, a full server under
// noeviction) is not an outage: New and AllowN report
// tierlimit.ErrMisconfigured.
//
// Many tenants share one Limiter (one cache, one set of goroutines, one
// heartbeat): WithLimitFunc gives each key its own limit, asked when the
// key claims a lease, so that a changed answer (a plan upgrade) applies
// within one lease TTL and the key keeps its state in Redis. AllowAll
// spends several keys' leases, all or nothing; WaitN waits in line for a
// key's tokens; Settle corrects a charge after the fact, through the
// key's lease when it can.
//
// docs/design.md states the guarantees with their proofs and bounds.
package hybrid
