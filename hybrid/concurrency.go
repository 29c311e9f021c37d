package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/evict"
	"github.com/tierlimit/tierlimit/internal/outage"
	"github.com/tierlimit/tierlimit/internal/permit"
	"github.com/tierlimit/tierlimit/internal/place"
	"github.com/tierlimit/tierlimit/internal/pulse"
	"github.com/tierlimit/tierlimit/internal/store"
)

// Defaults of the concurrency options.
const (
	// DefaultPermitTTL is how long an instance's block of permits outlives
	// its last renewal: a crashed instance's permits are free again within
	// it and one renewal interval (a third of it).
	DefaultPermitTTL = 10 * time.Second
	// DefaultPermitIdle is the window over which an instance measures a
	// key's use of its block: what it did not use goes back to Redis.
	DefaultPermitIdle = 500 * time.Millisecond
)

// Concurrency limits how many requests per key are in flight at once
// across a fleet sharing one Redis: at most N while Redis is healthy
// (docs/design.md, "Concurrency limits"). Each instance leases a block of
// a key's permits from Redis (the holder's count in the key's state, one
// script, as remote's permits) and hands them out in process: a permit
// from the block costs no Redis call, and only a key that needs more than
// its block calls Redis, one call at a time per key, which asks for a
// permit for every caller waiting on it. The block is renewed while held,
// and what goes unused for WithPermitIdle goes back. An instance gives
// from a block only while its own clock says Redis still holds it: until
// a TTL (less a margin) after the call that last confirmed it was sent.
//
// While Redis is down or stalled (calls over the budget while Redis is
// silent, opening a breaker) an instance gives out permits from its block
// until that deadline, and none beyond it: a refusal, not an error. When
// Redis answers again, a renewal records in Redis the permits it has out
// that Redis lost (so the fleet is exact again: nobody gets a new permit
// until the total is under N), then it leases as before.
//
// A Concurrency is safe for concurrent use. It must not be copied.
type Concurrency struct {
	rdb      redis.UniversalClient
	n        int64
	fn       tierlimit.PermitFunc
	cfg      concConfig
	id       string // this instance's holder id in every key's state
	fleetKey string
	guard    *outage.Guard
	lost     atomic.Uint64 // heartbeats after the first that found the instance gone from the fleet (see epoch)
	beaten   bool          // a heartbeat was answered; maintain's only
	stats    permit.Stats  // Waiting, Refused, Expired; the rest under mu
	queue    permit.Queue
	onPermit func(tierlimit.PermitDecision) // WithPermitObserver's, or nil

	// The counters of the hot path are under mu, which it holds anyway:
	// atomics beside it would be two more contended cache lines
	// (BenchmarkPermit).
	mu       sync.Mutex
	keys     map[string]*concKey
	out      permit.Slab[*concKey] // the permits out: a permit's id is its index here
	closed   bool
	acquired int64
	inUse    int64
	fallback int64

	isClosed atomic.Bool // closed, read without mu by the input checks

	// mono is the clock of the leases' deadlines (concKey.until): the
	// monotonic time since the limiter was made, which keeps running while
	// the process is stopped. One read of the monotonic clock, not
	// time.Now's two, on every permit given (BenchmarkPermit).
	mono    func() time.Duration
	honours bool // the client ends a call at its context's deadline (detach.Honours)

	done chan struct{} // closed by Close
	// life ends when Close begins: the background's calls end with it,
	// whatever the client's timeouts.
	life context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	// hold is the limiter's place among the limiters of this process
	// (internal/place), given up by Close.
	hold *place.Hold
}

// concKey is one key's permits in this instance.
type concKey struct {
	key    string
	rkeys  []string      // store.PermitKeys
	out    int64         // permits given out and not yet released
	held   int64         // permits Redis holds for this instance, as last told
	block  int64         // of those, how many it may give out: held, less what it recorded over N
	gen    uint64        // the epoch when Redis last told held: a block told in an earlier epoch is given from only once Redis confirms it
	until  time.Duration // the block is given from only before then (c.mono): Redis holds it at least until then
	claim  *claim        // the call to Redis in flight for the key, if any
	want   int64         // TryAcquire calls of the key waiting for a claim's answer: the next claim asks for all of them
	n      int64         // the key's number of permits, at its last acquisition
	seq    uint64        // answers applied to block: a renewal applies only if none came since it was sent
	peak   int64         // the most out at once since window began
	window time.Time     // when the current idle window began (zero: not yet)
}

// claim is one call setting a key's block.
type claim struct {
	done  chan struct{} // closed when Redis answered or the call failed
	err   error         // the call's error, once done
	room  bool          // Redis had permits free after the call, once done
	start time.Time
	sent  time.Duration // start by c.mono
}

// errHeldBack is a claim's error when the open breaker held the call back.
var errHeldBack = errors.New("hybrid: breaker open")

type concConfig struct {
	prefix    string
	ttl       time.Duration
	idle      time.Duration
	budget    time.Duration
	threshold int
	probe     time.Duration
	heartbeat time.Duration
}

// ConcurrencyOption configures a Concurrency.
type ConcurrencyOption interface {
	applyConcurrency(*Concurrency) error
}

type concurrencyOption func(*Concurrency) error

func (f concurrencyOption) applyConcurrency(c *Concurrency) error { return f(c) }

// WithPermitFunc gives each key its own number of permits (see
// tierlimit.PermitFunc); nil is an error.
func WithPermitFunc(f tierlimit.PermitFunc) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) (err error) {
		c.fn, err = permit.Func(f)
		return err
	})
}

// WithPermitTTL sets how long a block of permits outlives its last renewal
// (default DefaultPermitTTL; 30 ms to 1 h). Blocks are renewed every third
// of it.
func WithPermitTTL(d time.Duration) ConcurrencyOption {
	return durationOption("permit ttl", d, 30*time.Millisecond, time.Hour, func(c *concConfig) *time.Duration { return &c.ttl })
}

// WithPermitIdle sets the window over which a key's use of its block is
// measured (default DefaultPermitIdle; 1 ms to 1 min): at each window's
// end, the permits beyond the most the key had out at once in it go back to
// Redis (all of them for a key unused). A window is measured on the
// maintenance ticks, so a permit goes back between one and two windows
// after its last use.
func WithPermitIdle(d time.Duration) ConcurrencyOption {
	return durationOption("permit idle", d, time.Millisecond, time.Minute, func(c *concConfig) *time.Duration { return &c.idle })
}

// WithPermitCallBudget bounds how long an acquisition waits on Redis
// (default DefaultCallBudget; 1 ms to 10 s), as WithCallBudget does for
// rates. A call over it that finds Redis silent counts toward opening the
// breaker (DefaultBreakerThreshold consecutive failures; it probes again
// every DefaultProbeInterval).
func WithPermitCallBudget(d time.Duration) ConcurrencyOption {
	return durationOption("call budget", d, time.Millisecond, 10*time.Second, func(c *concConfig) *time.Duration { return &c.budget })
}

// WithPermitObserver gives o.Permit every acquisition (see
// tierlimit.Observer); o's other fields are not used. A nil o is an error.
func WithPermitObserver(o *tierlimit.Observer) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) (err error) {
		c.onPermit, err = permit.Observer(o)
		return err
	})
}

// WithPermitPrefix sets the prefix of the Redis keys (default
// store's "tierlimit:"), under WithPrefix's rules.
func WithPermitPrefix(prefix string) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) error {
		if err := store.CheckPrefix(prefix); err != nil {
			return err
		}
		c.cfg.prefix = prefix
		return nil
	})
}

func durationOption(name string, d, lo, hi time.Duration, field func(*concConfig) *time.Duration) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) error {
		if d < lo || d > hi {
			return fmt.Errorf("%w: %s %v, want %v to %v", tierlimit.ErrInvalidOption, name, d, lo, hi)
		}
		*field(&c.cfg) = d
		return nil
	})
}

// NewConcurrency returns a limiter of n permits per key (1 to
// tierlimit.MaxPermits: an error wrapping tierlimit.ErrInvalidLimit
// otherwise) leased from rdb; a nil rdb (a typed nil *redis.Client or
// *redis.ClusterClient too) or a bad option is an error wrapping
// tierlimit.ErrInvalidOption. It refuses, with an error wrapping
// tierlimit.ErrMisconfigured, a client that does not fit its server (a
// plain client on a Cluster node, a Cluster client on a standalone
// server), and a prefix where a live limiter of this process, of any
// tier, keeps another number of permits per key. It asks the server once,
// as New does, waiting at most store's NewTimeout (250 ms): a Redis that
// does not answer by then is logged, not an error. It starts the
// goroutine that renews blocks, gives back unused permits and beats in
// the fleet, which Close stops.
func NewConcurrency(rdb redis.UniversalClient, n int64, opts ...ConcurrencyOption) (*Concurrency, error) {
	if err := permit.CheckRedis(n, evict.NilClient(rdb)); err != nil {
		return nil, check.Named("hybrid", err)
	}
	c := &Concurrency{rdb: rdb, n: n, id: instanceID(), keys: make(map[string]*concKey), done: make(chan struct{}),
		cfg: concConfig{prefix: store.DefaultPrefix, ttl: DefaultPermitTTL, idle: DefaultPermitIdle, budget: DefaultCallBudget,
			threshold: DefaultBreakerThreshold, probe: DefaultProbeInterval, heartbeat: DefaultHeartbeat}}
	if err := permit.Apply(opts, func(o ConcurrencyOption) error { return o.applyConcurrency(c) }); err != nil {
		return nil, check.Named("hybrid", err)
	}
	if err := place.Client(rdb, store.NewTimeout, nil); err != nil {
		return nil, check.Named("hybrid", err)
	}
	hold, err := place.Take(c, "hybrid.NewConcurrency", rdb, c.cfg.prefix, place.PermitFamily, place.Permits(n))
	if err != nil {
		return nil, check.Named("hybrid", err)
	}
	c.hold = hold
	born := time.Now()
	c.mono = func() time.Duration { return time.Since(born) }
	c.honours = detach.Honours(rdb)
	c.life, c.stop = context.WithCancel(context.Background())
	c.guard = outage.New(c.cfg.budget, c.cfg.threshold, c.cfg.probe)
	pulse.Start() // the guard's silences less the process's own stalls; Close stops it
	c.fleetKey = store.PermitFleetKey(c.cfg.prefix, n)
	c.wg.Add(1)
	go c.maintain()
	return c, nil
}

// permits is a Concurrency as its permits' releaser: ReleasePermit is
// not part of Concurrency's API.
type permits Concurrency

// ReleasePermit gives permit (id, gen) back to its instance, without a
// Redis call: to a waiter in process, or to the block, which goes back to
// Redis once unused for WithPermitIdle. A generation not the record's
// (released already) does nothing.
func (r *permits) ReleasePermit(id, gen uint64) {
	c := (*Concurrency)(r)
	c.mu.Lock()
	k, ok := c.out.TakeID(id, gen)
	if !ok {
		c.mu.Unlock()
		return
	}
	k.out--
	c.inUse--
	wake := k.out < k.block && c.stats.Waiting.Load() > 0
	c.forget(k.key, k)
	c.mu.Unlock()
	if wake {
		c.queue.Wake(k.key)
	}
}

// TryAcquire returns a permit of key if one is free, without waiting for
// one to be released: from the instance's block, else by leasing more in
// one Redis call (waiting for it past the call budget only while Redis is
// slow, not down). It returns an error only for a bad key or
// permit func answer (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidLimit),
// a done ctx, a Redis that refuses the script (tierlimit.ErrMisconfigured),
// or after Close (tierlimit.ErrClosed).
func (c *Concurrency) TryAcquire(ctx context.Context, key string) (tierlimit.Permit, bool, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, false, err
	}
	if n == 0 {
		return permit.Blocked(&c.stats, c.onPermit)
	}
	p, ok, src, err := c.try(ctx, key, n)
	if err != nil {
		return tierlimit.Permit{}, false, err
	}
	permit.Report(c.onPermit, ok, src, 0)
	if !ok {
		c.stats.Refused.Add(1)
	}
	return p, ok, nil
}

// Acquire returns a permit of key, waiting for one until ctx is done: at
// once when one is released in this instance, else after a random wait
// that doubles up to a bound. It fails at once when ctx is done or its
// deadline has passed. Its errors are TryAcquire's, and ctx's error when
// it gives up waiting.
func (c *Concurrency) Acquire(ctx context.Context, key string) (tierlimit.Permit, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, err
	}
	if n == 0 {
		permit.Report(c.onPermit, false, tierlimit.SourceBlocked, 0)
		return tierlimit.Permit{}, tierlimit.ErrWaitDeadline // no permit will ever be free
	}
	return c.queue.Poll(ctx, key, &c.stats, c.done, c.onPermit, func() (tierlimit.Permit, bool, tierlimit.Source, error) {
		return c.try(ctx, key, n)
	})
}

// closeWait bounds Close's give-backs and its leaving the fleet, whatever
// the client's timeouts: what is not given back by then expires with its
// TTL.
const closeWait = time.Second

// Close stops the instance's background work, gives its unused permits
// back to Redis and leaves the fleet; it makes every later call, and every
// Acquire waiting, return tierlimit.ErrClosed. Permits out stay valid and
// may be released; Redis holds them until their TTL. It does not wait for
// calls to Redis in flight, and waits for its give-backs at most a second,
// whatever the client's timeouts: what a stalled Redis has not taken back
// by then expires with its TTL. It is idempotent and returns nil.
func (c *Concurrency) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.isClosed.Store(true)
	close(c.done)
	c.stop()
	c.mu.Unlock()
	c.hold.Drop()
	c.wg.Wait()
	defer pulse.Stop()
	if c.guard.Down() {
		return nil // the blocks expire with their TTL
	}
	type back struct {
		rkeys  []string
		target int64
	}
	c.mu.Lock()
	var backs []back
	for _, k := range c.keys {
		if k.held > k.out {
			k.block = min(k.block, k.out)
			backs = append(backs, back{k.rkeys, k.out})
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	_, _ = detach.Call(c.honours, ctx, func(ctx context.Context) (struct{}, error) {
		for _, b := range backs {
			if _, _, err := store.SetPermits(ctx, c.rdb, b.rkeys, c.id, b.target, c.n, c.cfg.ttl, false); err != nil {
				break // the rest expire with their TTL
			}
		}
		_, _, _ = store.Heartbeat(ctx, c.rdb, c.fleetKey, c.id, 3*c.cfg.heartbeat, true)
		return struct{}{}, nil
	})
	return nil
}

// Stats returns the instance's counters. Expired counts leased permits
// Redis had forgotten at a renewal; Fallback those given out while Redis
// was down.
func (c *Concurrency) Stats() tierlimit.ConcurrencyStats {
	s := c.stats.Read()
	c.mu.Lock()
	s.Acquired, s.InUse, s.Fallback = c.acquired, c.inUse, c.fallback
	c.mu.Unlock()
	return s
}

// check checks a call's input and returns the key's number of permits.
func (c *Concurrency) check(ctx context.Context, key string) (int64, error) {
	return permit.Check(ctx, "hybrid", c.isClosed.Load(), key, c.n, c.fn)
}

// epoch returns whether Redis is taken to be down, and the epoch: how many
// times the breaker opened, plus how many heartbeats found this instance
// gone from the fleet. Each is a time Redis may have lost the blocks
// (restarted empty, failed over): a block told in an earlier epoch is not
// given from until Redis confirms it. A restart go-redis's retries hide
// opens no breaker; the heartbeat finds it within one interval.
func (c *Concurrency) epoch() (down bool, epoch uint64) {
	down, outages := c.guard.State()
	return down, outages + c.lost.Load()
}

// maxRounds bounds the claims one TryAcquire waits for: each asks for
// every caller waiting on the key, so a round is lost only to another
// caller of this instance that took the permit first.
const maxRounds = 4

// try gives a permit of key from the block, else from a new lease, else
// (Redis down) from the block while its lease lasts; ok false if none. Callers that find no
// permit in the block wait together for one claim, which asks Redis for as
// many permits as there are callers waiting: a burst on a key with permits
// free gets them in one call, not one permit per call.
func (c *Concurrency) try(ctx context.Context, key string, n int64) (p tierlimit.Permit, ok bool, src tierlimit.Source, err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return p, false, 0, tierlimit.ErrClosed
	}
	k := c.entry(key)
	k.n = n
	if p, ok, fallback := c.take(key, k, n); ok {
		return p, true, source(fallback, tierlimit.SourceLocal), nil
	}
	if c.guard.Down() {
		// No caller waits on a Redis taken to be down: a claim goes out
		// only as the breaker's probe, and its answer is for later calls.
		if k.claim == nil {
			c.startClaim(k, n)
		}
		c.forget(key, k)
		c.mu.Unlock()
		return p, false, tierlimit.SourceFallback, nil
	}
	k.want++
	var cl *claim
	for round := 0; round < maxRounds; round++ {
		if k.claim == nil {
			if cl != nil && (cl.err != nil || !cl.room) {
				break // Redis had none free, or was not asked
			}
			cl = c.startClaim(k, n)
		} else {
			cl = k.claim
		}
		c.mu.Unlock()
		answered := c.await(ctx, cl)
		c.mu.Lock()
		k.want--
		if p, ok, fallback := c.take(key, k, n); ok {
			return p, true, source(fallback, tierlimit.SourceRemote), nil
		}
		k.want++
		if !answered {
			break
		}
	}
	k.want--
	c.forget(key, k)
	var err2 error
	if cl != nil {
		err2 = cl.err // set under c.mu
	}
	c.mu.Unlock()
	if tierlimit.Misconfigured(err2) {
		return p, false, 0, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, err2)
	}
	return p, false, tierlimit.SourceRemote, nil
}

// await waits for claim cl's answer and reports whether it came. Past the
// call budget it waits on while Redis is only slow (the breaker stays
// closed: a slow call is no outage, and a refusal would say that N are
// out), and returns false once the breaker opens, ctx ends or Close
// begins.
func (c *Concurrency) await(ctx context.Context, cl *claim) bool {
	select {
	case <-cl.done:
		return true
	default:
	}
	budget := time.NewTimer(c.cfg.budget)
	defer budget.Stop()
	for {
		select {
		case <-cl.done:
			return true
		case <-ctx.Done():
			return false
		case <-c.done:
			return false
		case <-budget.C:
			c.guard.Late(cl.start)
			if c.guard.Down() {
				return false
			}
			budget.Reset(c.cfg.budget)
		}
	}
}

// source is a permit's source: SourceFallback for one given while Redis was
// down, else
// src.
func source(fallback bool, src tierlimit.Source) tierlimit.Source {
	if fallback {
		return tierlimit.SourceFallback
	}
	return src
}

// entry returns key's entry, made if there is none. It is called with c.mu
// held. One entry per key at a time: its block is the count Redis holds
// for this instance, which calls set absolutely.
func (c *Concurrency) entry(key string) *concKey {
	k := c.keys[key]
	if k == nil {
		k = &concKey{key: key, rkeys: store.PermitKeys(c.cfg.prefix, key)}
		c.keys[key] = k
	}
	return k
}

// forget drops key's entry k if it holds nothing and no call is in flight
// for it. It is called with c.mu held.
func (c *Concurrency) forget(key string, k *concKey) {
	if k.out == 0 && k.held == 0 && k.claim == nil && k.want == 0 && c.keys[key] == k {
		delete(c.keys, key)
	}
}

// take gives a permit of k from its block or, while Redis is down, from
// k's block only, and only before the block's deadline (until), by this
// instance's clock: Redis holds the block at least until then, so a
// process stopped or a Redis paused past it finds nothing to give until a
// call confirms the block again. While Redis answers, a block Redis told
// of in an earlier epoch (before the breaker last opened, or a heartbeat
// found the instance gone) is not given from either: Redis may have
// restarted empty meanwhile, and a call (a claim, or the renewal that
// follows) confirms it first. It is called with c.mu held, and releases
// it when it returns a permit.
func (c *Concurrency) take(key string, k *concKey, n int64) (p tierlimit.Permit, ok, fallback bool) {
	down, gen := c.epoch()
	if k.out >= k.block || !down && k.gen != gen || c.mono() >= k.until {
		return p, false, false
	}
	fallback = down
	k.out++
	k.peak = max(k.peak, k.out)
	c.acquired++
	c.inUse++
	if fallback {
		c.fallback++
	}
	idx, gen := c.out.Put(k)
	c.mu.Unlock()
	return tierlimit.NewPermit((*permits)(c), uint64(idx), gen), true, fallback
}

// startClaim starts a call that leases a permit of k for each caller
// waiting (k.want) beyond those it has out, and confirms its block, unless
// the breaker holds calls back. It is called with c.mu held.
func (c *Concurrency) startClaim(k *concKey, n int64) *claim {
	cl := &claim{done: make(chan struct{}), start: time.Now(), sent: c.mono()}
	if !c.guard.Allow() {
		cl.err = errHeldBack
		close(cl.done)
		return cl
	}
	target := max(k.out+max(1, k.want), k.block)
	return c.setBlock(k, n, target, false, cl)
}

// leaseEnd returns until when (c.mono) a block Redis confirmed by a call
// sent at sent may be given from: Redis set its expiry a TTL after it ran
// the call, which was after sent; the margin covers the clocks' drift.
func (c *Concurrency) leaseEnd(sent time.Duration) time.Duration {
	return sent + c.cfg.ttl - c.cfg.ttl/10
}

// setBlock sends one call setting k's block to target (recording all of
// it with force), as claim cl, on a goroutine of its own. It is called
// with c.mu held; the call's answer updates the block whenever it comes.
func (c *Concurrency) setBlock(k *concKey, n, target int64, force bool, cl *claim) *claim {
	k.claim = cl
	_, gen := c.epoch() // before the call: a new epoch while it is out leaves the answer unconfirmed
	// Close does not wait for the call: what it lands after Close expires
	// with its TTL.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ttl/3)
		defer cancel()
		count, total, err := store.SetPermits(ctx, c.rdb, k.rkeys, c.id, target, n, c.cfg.ttl, force)
		c.guard.Done(cl.start, err)
		c.mu.Lock()
		if err == nil {
			// A record over N makes the key's total exceed it: what it
			// exceeds by is not given out again, only back (settle).
			k.held, k.block = count, max(0, count-max(0, total-n))
			k.gen = gen
			k.until = c.leaseEnd(cl.sent)
			k.seq++
			cl.room = total < n
		}
		cl.err = err
		k.claim = nil
		free := k.block - k.out
		c.forget(k.key, k)
		c.mu.Unlock()
		close(cl.done)
		for range min(free, 64) {
			c.queue.Wake(k.key)
		}
	}()
	return cl
}

// maintain beats in the fleet, renews blocks, records what was given out
// while Redis was down, and gives back idle permits, until Close.
func (c *Concurrency) maintain() {
	defer c.wg.Done()
	tick := time.NewTicker(min(c.cfg.idle/2, c.cfg.ttl/3, c.cfg.heartbeat))
	defer tick.Stop()
	c.beat()
	if !c.guard.Down() {
		_ = c.background(time.Second, func(ctx context.Context) error {
			return store.LoadPermits(ctx, c.rdb) // else the first claim loads it
		})
	}
	lastBeat, lastRenew := time.Now(), time.Now()
	var renewed uint64 // the epoch of the last renewal that reached every block
	for {
		select {
		case <-c.done:
			return
		case now := <-tick.C:
			if now.Sub(lastBeat) >= c.cfg.heartbeat {
				lastBeat = now
				c.beat()
			}
			// In a new epoch the blocks are confirmed at once, not at the
			// next renewal: until then they are not given from.
			if down, gen := c.epoch(); now.Sub(lastRenew) >= c.cfg.ttl/3 || !down && gen != renewed {
				lastRenew = now
				if c.renew(gen) {
					renewed = gen
				}
			}
			c.settle(now)
		}
	}
}

// background runs f, a call of maintain's, for at most d: it returns by
// then, or as soon as Close begins, whatever the client's timeouts (f goes
// on, and what it then does is lost).
func (c *Concurrency) background(d time.Duration, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(c.life, d)
	defer cancel()
	_, err := detach.Call(c.honours, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, f(ctx)
	})
	return err
}

// beat records the instance in the fleet and reads the fleet's size.
func (c *Concurrency) beat() {
	start := time.Now()
	var added bool
	err := c.background(max(c.cfg.budget, time.Second), func(ctx context.Context) (err error) {
		_, added, err = store.Heartbeat(ctx, c.rdb, c.fleetKey, c.id, 3*c.cfg.heartbeat, false)
		return err
	})
	if c.life.Err() != nil {
		return // Close began: no outcome
	}
	c.guard.Done(start, err)
	if err != nil {
		return
	}
	if added && c.beaten {
		c.lost.Add(1)
	}
	c.beaten = true
}

// renew extends every block's TTL in one pipeline and learns what Redis
// still holds for the instance; a block it learns of is confirmed at gen,
// the epoch before the call. It reports whether Redis answered for every
// block.
func (c *Concurrency) renew(gen uint64) bool {
	type sent struct {
		k   *concKey
		seq uint64
	}
	c.mu.Lock()
	var rs []store.Renewal
	var ks []sent
	for _, k := range c.keys {
		if k.held > 0 && k.claim == nil {
			// A block Redis lost is recorded again with the permits out.
			rs = append(rs, store.Renewal{Keys: k.rkeys, Holders: []string{c.id}, Want: []int64{k.out}})
			ks = append(ks, sent{k, k.seq})
		}
	}
	c.mu.Unlock()
	if len(rs) == 0 {
		return true
	}
	start, at := time.Now(), c.mono()
	err := c.background(c.cfg.ttl/3, func(ctx context.Context) error {
		store.RenewPermits(ctx, c.rdb, c.cfg.ttl, rs)
		return rs[0].Err
	})
	if c.life.Err() != nil {
		return false // Close began: the answers are not read
	}
	c.guard.Done(start, err)
	if err != nil {
		return false // rs is f's, which may still run
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	all := true
	for i, r := range rs {
		k := ks[i].k
		if r.Err != nil {
			all = false
			continue
		}
		if k.seq != ks[i].seq || k.claim != nil {
			continue // a newer answer, or one on its way, sets the block
		}
		switch got := r.Counts[0]; {
		case got < 0: // lost, and its permits out recorded again
			c.stats.Expired.Add(max(0, k.held+got))
			k.held = -got
			k.block = min(k.block, k.held)
		case got < k.held:
			c.stats.Expired.Add(k.held - got)
			k.held = got
			k.block = min(k.block, k.held)
		}
		k.gen = gen
		k.until = c.leaseEnd(at)
	}
	return all
}

// settle records in Redis the permits out beyond what Redis holds for a
// key (given while Redis was down, or after Redis forgot them), gives back
// the part of a block a key has not used over the last idle window (all of
// it for a key idle that long), and what it holds beyond its block and its
// permits out (recorded over N). It does nothing while Redis
// is down.
func (c *Concurrency) settle(now time.Time) {
	if c.guard.Down() || !c.guard.Allow() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.keys {
		if k.claim != nil {
			continue
		}
		if k.window.IsZero() {
			k.window, k.peak = now, k.out
		}
		if now.Sub(k.window) >= c.cfg.idle {
			// What the key did not use over the window goes back, its
			// block lowered first: no permit is given from what is on
			// its way back.
			k.block = min(k.block, max(k.peak, k.out))
			k.window, k.peak = now, k.out
		}
		switch keep := max(k.block, k.out); {
		case k.out > k.held:
			c.setBlock(k, k.n, k.out, true, &claim{done: make(chan struct{}), start: now, sent: c.mono()})
		case k.held > keep:
			c.setBlock(k, k.n, keep, false, &claim{done: make(chan struct{}), start: now, sent: c.mono()})
		}
	}
}

var _ tierlimit.Concurrency = (*Concurrency)(nil)
