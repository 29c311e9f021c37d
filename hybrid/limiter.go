package hybrid

// The Limiter: New, its state, Close, and the clock and key locks every
// path shares.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/front"
	"github.com/tierlimit/tierlimit/internal/perlimit"
	"github.com/tierlimit/tierlimit/internal/place"
	"github.com/tierlimit/tierlimit/internal/store"
	"github.com/tierlimit/tierlimit/internal/wait"
	"golang.org/x/sync/singleflight"
)

// Limiter is a distributed rate limiter that spends leased token batches in
// process (see the package documentation). It is safe for concurrent use and
// must not be copied.
//
// A Limiter is built once per process (or per limit) and lives as long as
// the process uses it: Close it to refund unspent tokens, leave the fleet and
// stop its background goroutines. One that becomes unreachable without
// Close is closed when the garbage collector finds it, so that a forgotten
// Close does not leave goroutines heartbeating for the fleet forever.
type Limiter struct {
	*limiter // what the background goroutines hold: never the Limiter itself

	cleanup runtime.Cleanup // closes the limiter when the Limiter is garbage
}

// limiter is a Limiter's state and logic (see Limiter).
type limiter struct {
	limit    tierlimit.Limit         // the default (New's)
	def      *policy                 // the default's
	pols     perlimit.Cache[*policy] // the other limits' (WithLimitFunc)
	cfg      config
	rdb      redis.UniversalClient
	bucket   *store.Limiter
	keys     *table
	place    atomic.Pointer[place.Hold]      // l's place in the registry of every tier's limiters, until unregister
	share    atomic.Pointer[tierlimit.Limit] // what each key is held to while the breaker is open
	brk      *breaker
	rtt      latency       // of Redis's answers: when a slow call counts as failed
	answered *atomic.Int64 // ns: when Redis last answered a call of this process (heard)
	inline   bool          // claims run on the caller's goroutine: rdb honours deadlines
	flights  singleflight.Group

	// The clock of the entries' instants (now): the monotonic time since
	// start, after epoch, when mono (the system clock).
	mono  bool
	start time.Time
	epoch int64

	waits   wait.Lines              // WaitN's callers, in line per key
	queues  [refillers]*refillQueue // the entries waiting for a background refill (queueOf)
	stats   counters
	stalled stalls // callers kept waiting on claims (see size)

	// The fleet: this instance's id, the Redis key of the fleet and the
	// number of live instances last seen (1 until a heartbeat answers).
	id        string
	fleet     string
	instances atomic.Int64
	refunds   atomic.Int64 // refunds sent, for their IDs
	doubts    doubts       // refunds counted lost that Redis may have run
	entries   atomic.Int64 // entries made, for their holder names

	// Observer funcs, nil when not observed.
	onDecision func(tierlimit.Decision)
	onCall     func(tierlimit.RedisCall)
	onGiveBack func(tierlimit.GiveBack)

	// decided counts decisions by source and outcome, striped by key so
	// that distinct keys decided on different cores do not contend on one
	// cache line (BenchmarkZipf10k's parallel case).
	decided [decisionStripes]struct {
		n [4][2]atomic.Int64
		_ [64]byte
	}

	// mu guards counts: the fleet's size seen by the last heartbeats,
	// newest first.
	mu     sync.Mutex
	counts [3]int64

	// keyLocks order a key's claims with its Reset and the janitor's
	// refunds (slow path only). Lock order: see table.
	keyLocks [256]sync.Mutex

	// misconfig is the last reply of Redis that means a misconfiguration
	// (tierlimit.Misconfigured), until a call succeeds: while it is set,
	// what would fall back is an error instead.
	misconfig atomic.Pointer[error]

	// silent is set when the last heartbeat got no answer from Redis
	// (a refused connection, a deadline), cleared when one does: beats
	// then stop while the breaker is open (see beat).
	silent atomic.Bool

	// final is set by Close before it takes the leases' tokens back:
	// tokens that land after it are lost (see land).
	final atomic.Bool

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New returns a Limiter enforcing limit for every key, with its state in the
// Redis behind rdb (a *redis.Client or *redis.ClusterClient). It starts the
// background goroutines that refill hot leases and refund expired ones.
//
// New makes up to three Redis calls, each within the call budget or 250 ms
// (store.NewTimeout, remote.NewTimeout), whichever is longer: a reading of
// the server's eviction settings (see Stats.Eviction); the first heartbeat
// (see WithHeartbeat), which runs a script that writes under the prefix;
// and, if Redis answered it, a SCRIPT LOAD of the token bucket's script, so
// that the first claim does not send and compile it within its budget. On
// a Redis that does not answer, New returns within about half a second with
// the default budget, having logged so in plain words, and the limiter
// decides on its fallback until Redis answers.
//
// New returns an error wrapping tierlimit.ErrInvalidLimit for a bad limit,
// tierlimit.ErrInvalidOption for a nil client or a bad option, and
// tierlimit.ErrMisconfigured if Redis refuses the limiter's commands (see
// tierlimit.Misconfigured: a password, an ACL permission, a renamed
// command, a replica, a full server under noeviction, a client of the
// wrong kind for the server), or if a live limiter of this process keeps
// another limit at a position both use (the default, then WithLimits' in
// order) under the same prefix on the same server, be it a Limiter or a
// remote.TokenBucket (whose buckets a Limiter leases from): the two would
// share buckets (WithPrefix separates them). Redis down or slow
// is not an error: the limiter starts in degraded mode and heals by itself.
func New(rdb redis.UniversalClient, limit tierlimit.Limit, opts ...Option) (*Limiter, error) {
	cfg := defaults()
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, named(err)
		}
	}
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	lookup, err := check.NewLookup(cfg.limitFunc, cfg.limitLookup, cfg.lookupOpen)
	if err != nil {
		return nil, named(err)
	}
	cfg.lookup = lookup
	def := newPolicy(limit, &cfg)
	if cfg.maxLease > def.capacity {
		return nil, invalid("lease bound %d exceeds burst %d", cfg.maxLease, def.capacity)
	}
	bucketCfg := store.Config{Prefix: cfg.prefix, Extra: cfg.extra, Logger: cfg.logger}
	if o := cfg.observer; o != nil && o.Eviction != nil {
		// The bucket reads the server's eviction settings (Stats.Eviction).
		bucketCfg.Observer = &tierlimit.Observer{Eviction: o.Eviction}
	}
	// The bucket keeps a ledger of the tokens each entry holds, and
	// refills only up to what they leave (G1 in docs/design.md). An entry
	// stops spending at its lease TTL; the janitor, which takes them back,
	// runs every quarter TTL: the ledger keeps them another half TTL.
	bucketCfg.Hold = leaseHold(cfg.leaseTTL)
	bucket, err := store.New(rdb, store.TokenBucket, limit, bucketCfg)
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	l := &limiter{
		limit:    limit,
		def:      def,
		cfg:      cfg,
		rdb:      rdb,
		bucket:   bucket,
		done:     make(chan struct{}),
		inline:   detach.Honours(rdb),
		start:    time.Now(),
		id:       instanceID(),
		fleet:    store.FleetKey(cfg.prefix, limit),
		answered: heard(rdb),
	}
	for i := range l.queues {
		l.queues[i] = newRefillQueue()
	}
	l.instances.Store(1)
	_, l.mono = cfg.clock.(tierlimit.SystemClock)
	l.epoch = l.start.UnixNano()
	l.rtt.floor = stallBudgets * cfg.callBudget
	fb := def.base
	if cfg.fallback != nil {
		fb = *cfg.fallback
	}
	l.share.Store(&fb)
	var onBreaker func(tierlimit.BreakerChange)
	if o := cfg.observer; o != nil {
		l.onDecision, l.onCall, l.onGiveBack, onBreaker = o.Decision, o.RedisCall, o.GiveBack, o.Breaker
	}
	l.brk = newBreaker(cfg.breakerThreshold, cfg.probeInterval, bucket.Misconfigured)
	l.keys, err = newTable(cfg.maxKeys, l.retire)
	if err != nil {
		return nil, invalid("cache: %v", err)
	}
	if err := register(l); err != nil {
		l.keys.release()
		return nil, err
	}
	// The first heartbeat, made here, tells the fleet's size from the
	// start and finds a misconfigured client (wrong password, missing ACL
	// permission) before any decision. Redis down is no error: New then
	// waits at most the call budget.
	if err := l.beat(false, max(cfg.callBudget, store.NewTimeout)); l.bucket.Misconfigured(err) {
		unregister(l)
		l.keys.release()
		return nil, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err)
	} else if err == nil {
		// The token bucket's script is loaded now, not sent and compiled
		// within the first claim's budget. Redis answered the beat: this
		// takes a round trip; a failure is the first claim's to see.
		ctx, cancel := context.WithTimeout(context.Background(), max(cfg.callBudget, store.NewTimeout))
		_, _ = detach.Call(l.inline, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, l.bucket.Load(ctx) })
		cancel()
	}
	l.wg.Add(2 + refillers)
	for i := range l.queues {
		go l.refiller(l.queues[i])
	}
	go l.janitor()
	go l.heartbeats()
	l.wg.Add(1)
	go l.notify(onBreaker)
	outer := &Limiter{limiter: l}
	// Close runs on a goroutine of its own: it may wait for Redis, and
	// cleanups share one goroutine.
	outer.cleanup = runtime.AddCleanup(outer, func(l *limiter) { go l.close() }, l)
	return outer, nil
}

// Close waits for the decisions and claims in flight, refunds every unspent
// token to Redis, stops the background goroutines and releases the cache.
// Later calls of every method return tierlimit.ErrClosed; Stats still
// reads the counters. Close is safe to call more than once, and
// concurrently with any method; it reports tokens it could not refund
// (they are counted in Stats.Lost).
//
// Close returns within about 1.2 s whatever the calls in flight and the
// client's timeouts: it waits for calls in flight and background work at
// most 300 ms, then for its refunds at most 900 ms. A call to a stalled
// Redis still running then ends when the client gives it up (its
// ReadTimeout); tokens it lands later are counted lost, and refunds that
// succeed later move from Stats.Lost to Stats.Refunded.
func (l *Limiter) Close() error {
	l.cleanup.Stop()
	return l.close()
}

// Limit returns the limit the fleet is held to.
func (l *Limiter) Limit() tierlimit.Limit { return l.limit }

func (l *limiter) keyLock(key string) *sync.Mutex { return &l.keyLocks[l.keyLockIndex(key)] }

func (l *limiter) keyLockIndex(key string) int {
	return int(keyHash(key) % uint64(len(l.keyLocks)))
}

// keyHash is the hash of a key behind the front table, the key locks and
// the counter stripes.
func keyHash(key string) uint64 { return front.Hash(key) }

// close is Close: the limiter's part, which a cleanup calls too.
func (l *limiter) close() error {
	l.closeOnce.Do(func() {
		unregister(l)
		// Callers and claims in flight end first, so that the refunds
		// below include the tokens they claimed.
		start := time.Now()
		l.waits.Close() // waiters leave with ErrClosed
		drained := l.keys.shut(closeDrain)
		close(l.done)
		awaitGroup(&l.wg, closeDrain-time.Since(start))
		l.final.Store(true) // see land
		l.closeErr = l.refundLast(l.collect(time.Time{}, true, l.keys.last()))
		l.keys.eachLast(l.retire)
		if drained {
			l.keys.release()
			return
		}
		go l.keys.release() // after the last call that uses ristretto
	})
	return l.closeErr
}

// awaitGroup waits for wg at most wait.
func awaitGroup(wg *sync.WaitGroup, wait time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// leaseHold is how long the bucket's ledger counts an entry's tokens after
// its last grant, for a lease TTL of ttl: the TTL, the janitor's quarter
// TTL to take them back, and as much again for a janitor running late.
func leaseHold(ttl time.Duration) time.Duration { return ttl + ttl/2 }

// now returns the clock in nanoseconds since the epoch. With the system
// clock it reads the monotonic clock only (time.Since), which costs half of
// time.Now on a VM's clock: the instants it returns are the start's wall
// time plus the monotonic time since, compared only with each other.
func (l *limiter) now() int64 {
	if l.mono {
		return l.epoch + int64(time.Since(l.start))
	}
	return l.cfg.clock.Now().UnixNano()
}
