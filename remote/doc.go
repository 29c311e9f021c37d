// Package remote provides exact rate limiters whose state lives in Redis:
// [TokenBucket], [GCRA], [FixedWindow], [AnchoredWindow], [SlidingLog] and
// [SlidingWindow].
//
// Every decision is one Lua script call (EVALSHA, EVAL on NOSCRIPT), atomic
// on the server, so concurrent callers on many app servers never race. Time
// comes from the Redis server (TIME), so clock skew between app servers does
// not change decisions. A rejected call charges nothing. Every key written
// has a TTL and disappears once its state no longer matters.
//
// All keys of one logical key share a Redis Cluster hash tag that the
// library derives from a hash of the key, so user keys may hold any bytes,
// '{' and '}' included. Several limits (say 1 per 5 s and 5 per hour) can be
// enforced together with [WithLimits]: all or nothing, still one round trip.
//
// Every limiter does, besides Allow, AllowN and Reset:
//   - per-key limits with [WithLimitFunc]: one limiter serves tenants of
//     any number of plans; a key whose limit changes keeps its state (a
//     bucket its tokens, up to the new Burst; a window its count);
//   - AllowAll: several keys at once, all-or-nothing (a user and its
//     organization), one round trip when the keys share a Cluster slot and
//     always on a single Redis; a refused call charges no key;
//   - WaitN: block until admitted, failing at once with
//     tierlimit.ErrWaitDeadline when the wait would pass the context's
//     deadline; waiters on a key queue in the process, and only the first
//     asks Redis;
//   - Settle: correct a charge after the fact (an estimate settled to the
//     real cost), capped at full, in one round trip; TokenBucket and GCRA
//     take an overrun into debt, down to minus the capacity, which the key
//     repays before it is admitted again; the windows keep no debt;
//   - AllowAtMost: take between 1 and n tokens, as many as the key holds
//     (a batch), in one round trip, or none with the wait for one.
//
// [Concurrency] limits requests in flight per key instead of a rate: a
// permit per request, held in Redis with a TTL renewed while held, one
// round trip to acquire and one to release.
//
// The limiters are safe for concurrent use. Their errors are bad input
// (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost, and
// tierlimit.ErrInvalidLimit for a bad WithLimitFunc answer),
// tierlimit.ErrWaitDeadline, a cancelled context, or the Redis error,
// wrapped; a denial is a Result, not an error.
package remote
