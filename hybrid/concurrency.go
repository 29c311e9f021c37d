package hybrid

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
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
// its block calls Redis, one call at a time per key. The block is renewed
// while held, and what goes unused for WithPermitIdle goes back.
//
// While Redis is down or stalled (calls over the budget while Redis is
// silent, opening a breaker) an instance gives out a permit only while it
// has fewer out than its share of N: N divided by the live instances (from
// the fleet's heartbeats), at least 1, whatever its block. No caller gets an
// error for it. When Redis answers again, the instance records in Redis
// the permits it has out beyond its block (so the fleet is exact again:
// nobody gets a new permit until the total is under N), then leases as
// before.
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
	live     atomic.Int64  // instances alive, at the last heartbeat
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

	done chan struct{} // closed by Close
	wg   sync.WaitGroup
	// hold is the limiter's place among the limiters of this process
	// (internal/place), given up by Close.
	hold *place.Hold
}

// concKey is one key's permits in this instance.
type concKey struct {
	key    string
	rkeys  []string  // store.PermitKeys
	out    int64     // permits given out and not yet released
	held   int64     // permits Redis holds for this instance, as last told
	block  int64     // of those, how many it may give out: held, less what it recorded over N
	gen    uint64    // the epoch when Redis last told held: a block told in an earlier epoch is given from only once Redis confirms it
	claim  *claim    // the call to Redis in flight for the key, if any
	n      int64     // the key's number of permits, at its last acquisition
	seq    uint64    // answers applied to block: a renewal applies only if none came since it was sent
	peak   int64     // the most out at once since window began
	window time.Time // when the current idle window began (zero: not yet)
}

// claim is one call setting a key's block.
type claim struct {
	done  chan struct{} // closed when Redis answered or the call failed
	err   error         // the call's error, once done
	start time.Time
}

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
	c.guard = outage.New(c.cfg.budget, c.cfg.threshold, c.cfg.probe)
	pulse.Start() // the guard's silences less the process's own stalls; Close stops it
	c.fleetKey = store.PermitFleetKey(c.cfg.prefix, n)
	c.live.Store(1)
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
// one Redis call (at most the call budget), else, while Redis is down,
// from the instance's share. It returns an error only for a bad key or
// permit func answer (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidLimit),
// a done ctx, a Redis that refuses the script (tierlimit.ErrMisconfigured),
// or after Close (tierlimit.ErrClosed).
func (c *Concurrency) TryAcquire(ctx context.Context, key string) (tierlimit.Permit, bool, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, false, err
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
	return c.queue.Poll(ctx, key, &c.stats, c.done, c.onPermit, func() (tierlimit.Permit, bool, tierlimit.Source, error) {
		return c.try(ctx, key, n)
	})
}

// Close stops the instance's background work, gives its unused permits
// back to Redis and leaves the fleet; it makes every later call, and every
// Acquire waiting, return tierlimit.ErrClosed. Permits out stay valid and
// may be released; Redis holds them until their TTL. It waits for calls
// to Redis in flight, which the client's timeouts bound. It is idempotent
// and returns nil.
func (c *Concurrency) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.isClosed.Store(true)
	close(c.done)
	c.mu.Unlock()
	c.hold.Drop()
	c.wg.Wait()
	defer pulse.Stop()
	if c.guard.Down() {
		return nil // the blocks expire with their TTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.mu.Lock()
	var back []*concKey
	for _, k := range c.keys {
		if k.held > k.out {
			k.block = min(k.block, k.out)
			back = append(back, k)
		}
	}
	c.mu.Unlock()
	for _, k := range back {
		c.mu.Lock()
		target := k.out
		c.mu.Unlock()
		if _, _, err := store.SetPermits(ctx, c.rdb, k.rkeys, c.id, target, c.n, c.cfg.ttl, false); err != nil {
			break // the rest expire with their TTL
		}
	}
	_, _, _ = store.Heartbeat(ctx, c.rdb, c.fleetKey, c.id, 3*c.cfg.heartbeat, true)
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

// share is the most an instance has out of a key of n permits while Redis
// is down, its block included: n over the live instances, at least 1.
func (c *Concurrency) share(n int64) int64 {
	return max(1, n/max(1, c.live.Load()))
}

// try gives a permit of key from the block, else from a new lease, else
// (Redis down) from the share; ok false if none.
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
	cl := k.claim
	if cl == nil {
		cl = c.startClaim(k, n)
	}
	c.mu.Unlock()
	budget := time.NewTimer(c.cfg.budget)
	defer budget.Stop()
	select {
	case <-cl.done:
	case <-budget.C:
		c.guard.Late(cl.start)
	case <-ctx.Done():
	}
	c.mu.Lock()
	// The claim's end may have forgotten the entry: a new one is the key's
	// only record now.
	k = c.entry(key)
	if p, ok, fallback := c.take(key, k, n); ok {
		return p, true, source(fallback, tierlimit.SourceRemote), nil
	}
	c.forget(key, k)
	c.mu.Unlock()
	select {
	case <-cl.done:
		if tierlimit.Misconfigured(cl.err) {
			return p, false, 0, fmt.Errorf("hybrid: %w: %w", tierlimit.ErrMisconfigured, cl.err)
		}
	default:
	}
	return p, false, tierlimit.SourceRemote, nil
}

// source is a permit's source: SourceFallback for one from the share, else
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
	if k.out == 0 && k.held == 0 && k.claim == nil && c.keys[key] == k {
		delete(c.keys, key)
	}
}

// take gives a permit of k from its block or, while Redis is down, from
// the instance's share. A block Redis told of in an earlier epoch (before
// the breaker last opened, or a heartbeat found the instance gone) is not
// given from: Redis may have restarted empty meanwhile, and a call (a
// claim, or the renewal that follows) confirms it first. It is called
// with c.mu held, and releases it when it returns a permit.
func (c *Concurrency) take(key string, k *concKey, n int64) (p tierlimit.Permit, ok, fallback bool) {
	switch down, gen := c.epoch(); {
	case down && k.out < c.share(n):
		fallback = true
	case down, k.out >= k.block, k.gen != gen:
		return p, false, false
	}
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

// startClaim starts a call that leases one more permit of k than it has
// out, unless the breaker holds calls
// back. It is called with c.mu held.
func (c *Concurrency) startClaim(k *concKey, n int64) *claim {
	cl := &claim{done: make(chan struct{}), start: time.Now()}
	if !c.guard.Allow() {
		close(cl.done)
		return cl
	}
	target := max(k.out, k.block) + 1
	return c.setBlock(k, n, target, false, cl)
}

// setBlock sends one call setting k's block to target (recording all of
// it with force), as claim cl, on a goroutine of its own. It is called
// with c.mu held; the call's answer updates the block whenever it comes.
func (c *Concurrency) setBlock(k *concKey, n, target int64, force bool, cl *claim) *claim {
	k.claim = cl
	_, gen := c.epoch() // before the call: a new epoch while it is out leaves the answer unconfirmed
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
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
			k.seq++
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
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = store.LoadPermits(ctx, c.rdb) // else the first claim loads it
		cancel()
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

// beat records the instance in the fleet and reads the fleet's size.
func (c *Concurrency) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), max(c.cfg.budget, time.Second))
	defer cancel()
	start := time.Now()
	live, added, err := store.Heartbeat(ctx, c.rdb, c.fleetKey, c.id, 3*c.cfg.heartbeat, false)
	c.guard.Done(start, err)
	if err != nil {
		return
	}
	if added && c.beaten {
		c.lost.Add(1)
	}
	c.beaten = true
	if live > 0 {
		c.live.Store(live)
	}
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
			rs = append(rs, store.Renewal{Keys: k.rkeys, Holders: []string{c.id}})
			ks = append(ks, sent{k, k.seq})
		}
	}
	c.mu.Unlock()
	if len(rs) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ttl/3)
	defer cancel()
	start := time.Now()
	store.RenewPermits(ctx, c.rdb, c.cfg.ttl, rs)
	c.guard.Done(start, rs[0].Err)
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
		if r.Counts[0] < k.held {
			c.stats.Expired.Add(k.held - r.Counts[0])
			k.held = r.Counts[0]
			k.block = min(k.block, k.held)
		}
		k.gen = gen
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
			c.setBlock(k, k.n, k.out, true, &claim{done: make(chan struct{}), start: now})
		case k.held > keep:
			c.setBlock(k, k.n, keep, false, &claim{done: make(chan struct{}), start: now})
		}
	}
}

var _ tierlimit.Concurrency = (*Concurrency)(nil)
