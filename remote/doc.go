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
// The limiters are safe for concurrent use. Their errors are bad input
// (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidCost), a cancelled context,
// or the Redis error, wrapped; a denial is a Result, not an error.
package remote
