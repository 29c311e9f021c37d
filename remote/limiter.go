package remote

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/evict"
)

// algorithm describes one script: how its keys are named and what it is told
// about each limit.
type algorithm struct {
	name     string // short name in Redis keys, e.g. "tb"
	script   *redis.Script
	keys     []string                    // key suffixes per limit, e.g. {""} or {":z", ":h"}
	params   func(tierlimit.Limit) []any // per-limit ARGV
	validate func(tierlimit.Limit) error // rules beyond Limit.Validate
	capacity func(tierlimit.Limit) int64 // largest cost one call may ask
	holders  bool                        // ledger.lua: ARGV ends with a holder (tail)
}

// limiter is the engine behind every algorithm: key naming, argument
// building, the script call and the reply. It is safe for concurrent use.
type limiter struct {
	rdb    redis.UniversalClient
	alg    *algorithm
	limits []tierlimit.Limit
	bases  []string // per key: prefix, algorithm, config hash, up to the hash tag
	suffix []string // per key: what follows the user key
	params []any    // per-limit ARGV, built once
	clock  Clock
	maxN   int64
	tail   []any // ARGV after params of a call that names no holder (ledger.lua's)

	// The observer's funcs (WithObserver), nil when not observed: the
	// unobserved path reads no clock.
	onDecision func(tierlimit.Decision)
	onCall     func(tierlimit.RedisCall)

	// watch follows the server's eviction settings: read at New, again
	// about once a minute from a call's goroutine.
	watch *evict.Watch

	// oneHead and oneArgs are the ARGV of the most common call (server
	// clock, n = 1), built once: go-redis copies ARGV and never changes
	// it, so every call may share it.
	oneHead []int64
	oneArgs []any
}

func newLimiter(rdb redis.UniversalClient, alg *algorithm, limit tierlimit.Limit, opts []Option, oneHead ...int64) (*limiter, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: remote: nil redis client", tierlimit.ErrInvalidOption)
	}
	cfg := config{prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: remote: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.hold != 0 {
		if alg != tokenBucketAlg || len(cfg.extra) > 0 {
			return nil, fmt.Errorf("%w: remote: WithLeaseLedger is for a TokenBucket of one limit", tierlimit.ErrInvalidOption)
		}
		alg = ledgerAlg(cfg.hold)
	}
	l := &limiter{rdb: rdb, alg: alg, clock: cfg.clock, limits: append([]tierlimit.Limit{limit}, cfg.extra...)}
	if alg.holders {
		l.tail = noHolder
	}
	var onEviction func(tierlimit.EvictionRisk)
	if o := cfg.obs; o != nil {
		l.onDecision, l.onCall, onEviction = o.Decision, o.RedisCall, o.Eviction
	}
	l.maxN = -1
	for _, lim := range l.limits {
		if err := lim.Validate(); err != nil {
			return nil, fmt.Errorf("remote: %s: %w", alg.name, err)
		}
		if alg.validate != nil {
			if err := alg.validate(lim); err != nil {
				return nil, fmt.Errorf("remote: %s: %w", alg.name, err)
			}
		}
		if c := alg.capacity(lim); l.maxN < 0 || c < l.maxN {
			l.maxN = c
		}
		l.params = append(l.params, alg.params(lim)...)
		base := cfg.prefix + alg.name + ":" + configHash(alg.name, lim) + ":{"
		for _, s := range alg.keys {
			l.bases = append(l.bases, base)
			l.suffix = append(l.suffix, s)
		}
	}
	if len(oneHead) == 0 {
		oneHead = []int64{1}
	}
	l.oneHead, l.oneArgs = oneHead, l.args(oneHead)
	l.watch = evict.NewWatch(rdb, onEviction)
	ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
	defer cancel()
	l.watch.Check(ctx)
	return l, nil
}

// evictionCheckTimeout bounds a reading of the server's eviction settings.
const evictionCheckTimeout = time.Second

// Eviction returns what the Redis server said about evicting keys when last
// read: at New (within a second), then about once a minute while the
// limiter is used, on a goroutine of its own. Each reading that differs in
// risk is reported to WithObserver's Eviction, and logged (log/slog) when
// it becomes risky or unknown.
func (l *limiter) Eviction() tierlimit.EvictionRisk { return l.watch.Last() }

// checkEviction reads the eviction settings again on a goroutine of its
// own (bounded by evictionCheckTimeout) when they are due.
func (l *limiter) checkEviction() {
	if !l.watch.Due(time.Now()) {
		return
	}
	go func() {
		defer l.watch.Done()
		ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
		defer cancel()
		l.watch.Check(ctx)
	}()
}

// redisErr wraps an error of a Redis call made for op: with
// tierlimit.ErrMisconfigured too when Redis refuses the limiter's commands.
func (l *limiter) redisErr(op string, err error) error {
	if tierlimit.Misconfigured(err) {
		return fmt.Errorf("remote: %s: %w: %w", op, tierlimit.ErrMisconfigured, err)
	}
	return fmt.Errorf("remote: %s: %w", op, err)
}

// args builds ARGV: the clock, head, then the limits' parameters.
func (l *limiter) args(head []int64) []any { return l.argsTail(head, l.tail) }

// argsTail is args with tail after the params, instead of l.tail.
func (l *limiter) argsTail(head []int64, tail []any) []any {
	args := make([]any, 0, 1+len(head)+len(l.params)+len(tail))
	args = append(args, l.now())
	for _, h := range head {
		args = append(args, h)
	}
	return append(append(args, l.params...), tail...)
}

// configHash names a limit's configuration in its keys, so that changing a
// limit never reads state written under another.
func configHash(alg string, l tierlimit.Limit) string {
	s := alg + "/" + strconv.FormatInt(l.Rate, 10) + "/" + strconv.FormatInt(l.PeriodMicros(), 10) +
		"/" + strconv.FormatInt(l.Capacity(), 10)
	return strconv.FormatUint(xxhash.Sum64String(s)&0xffffffff, 36)
}

// keyTag is the Cluster hash tag of a user key: a hash, so that no byte of the
// key can move or split its slot.
func keyTag(key string) [16]byte {
	var sum [8]byte
	h := xxhash.Sum64String(key)
	for i := range sum {
		sum[i] = byte(h >> (56 - 8*i))
	}
	var tag [16]byte
	hex.Encode(tag[:], sum[:])
	return tag
}

// redisKeys returns the Redis keys of a user key, in script order.
func (l *limiter) redisKeys(key string) []string {
	tag := keyTag(key)
	keys := make([]string, len(l.bases))
	for i, b := range l.bases {
		keys[i] = b + string(tag[:]) + "}:" + key + l.suffix[i]
	}
	return keys
}

// now returns the client clock in µs for ARGV[1], or 0 for the server's TIME.
func (l *limiter) now() int64 {
	if l.clock == nil {
		return 0
	}
	return l.clock.Now().UnixMicro()
}

// check validates a key and a cost.
func (l *limiter) check(key string, n int64) error {
	if err := tierlimit.CheckKey(key); err != nil {
		return err
	}
	if n < 0 || n > l.maxN {
		return fmt.Errorf("%w: n %d must be between 0 and %d", tierlimit.ErrInvalidCost, n, l.maxN)
	}
	return nil
}

// AllowN reports whether n events may happen now for key, and charges them
// if so. n == 0 peeks: it charges nothing and is always allowed, with
// Remaining telling what is left.
func (l *limiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	if l.observed() {
		return l.observedAllow(ctx, key, n, n)
	}
	if err := l.check(key, n); err != nil {
		return tierlimit.Result{}, err
	}
	res, _, err := l.call(ctx, key, n)
	return res, err
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// Reset forgets key's state under every limit: the key is back to full capacity.
func (l *limiter) Reset(ctx context.Context, key string) error {
	if err := tierlimit.CheckKey(key); err != nil {
		return err
	}
	start := l.start()
	err := l.rdb.Del(ctx, l.redisKeys(key)...).Err()
	l.reportCall("reset", start, err)
	if err != nil {
		return l.redisErr("reset", err)
	}
	return nil
}

func (l *limiter) observed() bool { return l.onDecision != nil || l.onCall != nil }

// observedAllow is AllowN, with head the ARGV after the clock, when
// observed: it reports the Redis call and, if it succeeded, the decision.
func (l *limiter) observedAllow(ctx context.Context, key string, n int64, head ...int64) (tierlimit.Result, error) {
	start := time.Now()
	if err := l.check(key, n); err != nil {
		return tierlimit.Result{}, err
	}
	res, _, err := l.call(ctx, key, head...)
	lat := time.Since(start)
	if l.onCall != nil {
		l.onCall(tierlimit.RedisCall{Op: "allow", Latency: lat, Err: err})
	}
	if err == nil && l.onDecision != nil {
		l.onDecision(tierlimit.Decision{Allowed: res.Allowed, Source: tierlimit.SourceRemote, N: n, Latency: lat})
	}
	return res, err
}

// start returns the time a Redis call starts, for reportCall; the zero
// time when no one observes calls. Latency is measured on the local
// monotonic clock, whatever clock decides.
func (l *limiter) start() time.Time {
	if l.onCall == nil {
		return time.Time{}
	}
	return time.Now()
}

// reportCall reports a Redis call that began at start, if observed.
func (l *limiter) reportCall(op string, start time.Time, err error) {
	if l.onCall != nil {
		l.onCall(tierlimit.RedisCall{Op: op, Latency: time.Since(start), Err: err})
	}
}

// call runs the script with head ARGV (after the clock) and returns the
// result and the number of tokens granted.
func (l *limiter) call(ctx context.Context, key string, head ...int64) (tierlimit.Result, int64, error) {
	args := l.oneArgs
	if l.clock != nil || !slices.Equal(head, l.oneHead) {
		args = l.args(head)
	}
	return l.run(ctx, key, args)
}

// run runs the script for key with ARGV args.
func (l *limiter) run(ctx context.Context, key string, args []any) (tierlimit.Result, int64, error) {
	l.checkEviction()
	reply, err := l.alg.script.Run(ctx, l.rdb, l.redisKeys(key), args...).Slice()
	if err != nil {
		return tierlimit.Result{}, 0, l.redisErr(l.alg.name, err)
	}
	return l.result(reply)
}

// result folds a script reply {allowed, granted, per limit: remaining,
// retry_us, reset_us} into one Result: the most restrictive limit decides.
func (l *limiter) result(reply []any) (tierlimit.Result, int64, error) {
	if len(reply) != 2+3*len(l.limits) {
		return tierlimit.Result{}, 0, fmt.Errorf("remote: %s: reply of %d values, want %d",
			l.alg.name, len(reply), 2+3*len(l.limits))
	}
	at := func(i int) int64 {
		v, _ := reply[i].(int64) // the scripts reply integers only
		return v
	}
	res := tierlimit.Result{Allowed: at(0) == 1, Source: tierlimit.SourceRemote, Remaining: -1}
	var worstRetry int64 = -1
	for i, lim := range l.limits {
		rem := min(max(at(2+3*i), 0), l.alg.capacity(lim))
		retry, reset := max(at(3+3*i), 0), max(at(4+3*i), 0)
		if res.Allowed && (res.Remaining < 0 || rem < res.Remaining) {
			res.Limit = lim
		}
		if !res.Allowed && retry > worstRetry {
			worstRetry = retry
			res.Limit = lim
			res.RetryAfter = micros(retry)
		}
		if res.Remaining < 0 || rem < res.Remaining {
			res.Remaining = rem
		}
		res.ResetAfter = max(res.ResetAfter, micros(reset))
	}
	return res, at(1), nil
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
