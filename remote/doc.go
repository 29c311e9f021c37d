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
// Every method returns by its context's end (deadline or cancellation),
// whatever the client does with the context: go-redis's default client
// (ContextTimeoutEnabled false) waits for a stalled Redis up to its
// ReadTimeout, 3 s. While a context can end, the call to Redis runs on a
// goroutine of its own, which outlives a caller gone at the context's end
// until the client gives the call up. It runs on the caller's with a
// context that cannot end (context.Background()), and with a deadline on
// a client that ends calls at it itself (ContextTimeoutEnabled), where it
// costs nothing more. The caller gone gets
// the context's error, which says nothing of Redis's state: a script sent
// before the context's end runs when Redis reads it, once (go-redis sends
// a command again only while its context lasts). So an AllowN,
// AllowAtMost or WaitN whose caller got that error may have charged its
// cost without admitting anyone: the key admits that much less until it
// refills (the limit errs toward admitting less, never more); do not give
// such a charge back with Settle, which would give back one perhaps never
// made. A Settle or Reset may or may not have been applied. AllowAll on a
// Cluster runs on to its end (give-backs included) whatever its context,
// so a refused call still charges no key (go-redis may then send a script
// again after a timeout of its own); elsewhere it is one script.
//
// The limiters are safe for concurrent use. Their errors are bad input
// (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost, and
// tierlimit.ErrInvalidLimit for a bad WithLimitFunc answer),
// tierlimit.ErrWaitDeadline, a cancelled context, or the Redis error,
// wrapped; a denial is a Result, not an error.
package remote
