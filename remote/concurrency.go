package remote

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/evict"
	"github.com/tierlimit/tierlimit/internal/permit"
	"github.com/tierlimit/tierlimit/internal/place"
	"github.com/tierlimit/tierlimit/internal/store"
)

// DefaultPermitTTL is how long a permit outlives its holder's last renewal
// unless WithPermitTTL says otherwise: a crashed process's permits are
// free again within it and one renewal interval (a third of it).
const DefaultPermitTTL = 10 * time.Second

// Bounds of WithPermitTTL.
const (
	MinPermitTTL = 30 * time.Millisecond
	MaxPermitTTL = time.Hour
)

// releaseTimeout bounds how long Release waits for Redis (or the TTL if
// shorter), whatever the client's timeouts: the call goes on after that.
const releaseTimeout = time.Second

// Concurrency limits how many requests per key are in flight at once
// across every process that shares its Redis and prefix: at most N permits
// of a key are held at any time while Redis is healthy (docs/design.md,
// "Concurrency limits").
//
// Each permit is a holder of its own in the key's Redis state, expiring a
// TTL after its last renewal; a goroutine renews every held permit each
// third of the TTL, one pipeline per tick. A permit whose renewal Redis
// does not see for a TTL (a crashed process, a long outage) expires and
// is free for others: its Release then does nothing. TryAcquire and
// Release make one round trip each.
//
// TryAcquire and Acquire return by their context's end whatever the
// client's timeouts (go-redis's default client waits for a stalled Redis
// up to its ReadTimeout): the call to Redis goes on on a goroutine of its
// own, and a permit it is granted after its caller has gone is given back
// (or, if the client lost Redis's reply, expires within the TTL).
// Release waits for Redis at most a second, Close not at all.
//
// A Concurrency is safe for concurrent use. It must not be copied.
type Concurrency struct {
	rdb    redis.UniversalClient
	n      int64
	fn     tierlimit.PermitFunc
	prefix string
	ttl    time.Duration
	id     string // this limiter's part of its holder ids
	seq    atomic.Uint64
	stats  permit.Stats
	queue  permit.Queue
	// onPermit is WithPermitObserver's, or nil.
	onPermit func(tierlimit.PermitDecision)

	mu     sync.Mutex
	held   map[string]*heldKey // by user key: the permits to renew
	out    permit.Slab[held]   // the permits out: a permit's id is its index here
	closed bool

	done chan struct{} // closed by Close
	wg   sync.WaitGroup
	// hold is the limiter's place among the limiters of this process
	// (internal/place), given up by Close.
	hold *place.Hold
	// honours: the client ends a call at its context's deadline itself
	// (detach.Honours), so a call with a deadline needs no goroutine.
	honours bool
}

// held is a permit out: its key and its holder id in Redis.
type held struct{ key, holder string }

// heldKey is one key's permits this limiter holds.
type heldKey struct {
	keys    []string // store.PermitKeys
	holders map[string]struct{}
}

// ConcurrencyOption configures a Concurrency.
type ConcurrencyOption interface {
	applyConcurrency(*Concurrency) error
}

type concurrencyOption func(*Concurrency) error

func (f concurrencyOption) applyConcurrency(c *Concurrency) error { return f(c) }

// WithPermitObserver gives o.Permit every acquisition (see
// tierlimit.Observer); o's other fields are not used. A nil o is an error.
func WithPermitObserver(o *tierlimit.Observer) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) (err error) {
		c.onPermit, err = permit.Observer(o)
		return err
	})
}

// WithPermitFunc gives each key its own number of permits (see
// tierlimit.PermitFunc); nil is an error. A key whose number falls while
// more are held keeps them until they are released.
func WithPermitFunc(f tierlimit.PermitFunc) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) (err error) {
		c.fn, err = permit.Func(f)
		return err
	})
}

// WithPermitTTL sets how long a permit outlives its last renewal (default
// DefaultPermitTTL, between MinPermitTTL and MaxPermitTTL). Holders renew
// every third of it, so a shorter TTL frees a crashed holder's permits
// sooner for more renewal calls.
func WithPermitTTL(d time.Duration) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) error {
		if d < MinPermitTTL || d > MaxPermitTTL {
			return fmt.Errorf("%w: permit ttl %v, want %v to %v", tierlimit.ErrInvalidOption, d, MinPermitTTL, MaxPermitTTL)
		}
		c.ttl = d
		return nil
	})
}

// WithPermitPrefix sets the prefix of the Redis keys of the permits
// (default DefaultPrefix), under WithPrefix's rules.
func WithPermitPrefix(prefix string) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) error {
		if err := store.CheckPrefix(prefix); err != nil {
			return err
		}
		c.prefix = prefix
		return nil
	})
}

// NewConcurrency returns a limiter of n permits per key (1 to
// tierlimit.MaxPermits: an error wrapping tierlimit.ErrInvalidLimit
// otherwise) kept in rdb; a nil rdb (a typed nil *redis.Client or
// *redis.ClusterClient too) or a bad option is an error wrapping
// tierlimit.ErrInvalidOption. It refuses, with an error wrapping
// tierlimit.ErrMisconfigured, a client that does not fit its server (a
// plain client on a Cluster node, a Cluster client on a standalone
// server), and a prefix where a live limiter of this process, of any
// tier, keeps another number of permits per key. It asks the server once,
// as the rate limiters' constructors do, waiting at most NewTimeout: a
// Redis that does not answer by then is logged, not an error. It starts
// the renewal goroutine, which Close stops.
func NewConcurrency(rdb redis.UniversalClient, n int64, opts ...ConcurrencyOption) (*Concurrency, error) {
	if err := permit.CheckRedis(n, evict.NilClient(rdb)); err != nil {
		return nil, check.Named("remote", err)
	}
	c := &Concurrency{rdb: rdb, n: n, prefix: DefaultPrefix, ttl: DefaultPermitTTL,
		held: make(map[string]*heldKey), done: make(chan struct{})}
	if err := permit.Apply(opts, func(o ConcurrencyOption) error { return o.applyConcurrency(c) }); err != nil {
		return nil, check.Named("remote", err)
	}
	if err := place.Client(rdb, NewTimeout, nil); err != nil {
		return nil, check.Named("remote", err)
	}
	hold, err := place.Take(c, "remote.NewConcurrency", rdb, c.prefix, place.PermitFamily, place.Permits(n))
	if err != nil {
		return nil, check.Named("remote", err)
	}
	c.hold = hold
	c.honours = detach.Honours(rdb)
	var b [8]byte
	_, _ = crand.Read(b[:])
	c.id = hex.EncodeToString(b[:])
	c.wg.Add(1)
	go c.renewLoop()
	return c, nil
}

// permits is a Concurrency as its permits' releaser: ReleasePermit is
// not part of Concurrency's API.
type permits Concurrency

// ReleasePermit gives permit (id, gen) back to Redis in one call, then
// wakes the key's longest waiter in this process. It waits for Redis at
// most a second (or the TTL if shorter), whatever the client's timeouts:
// the call goes on after that, and wakes the waiter when it lands. If that
// call fails, the permit expires within its TTL, no longer renewed. A
// generation not the record's (released already) does nothing.
func (r *permits) ReleasePermit(id, gen uint64) {
	c := (*Concurrency)(r)
	c.mu.Lock()
	p, ok := c.out.TakeID(id, gen)
	c.mu.Unlock()
	if ok {
		c.release(p)
	}
}

// TryAcquire returns a permit of key if fewer than its number are held,
// in one round trip, without waiting. It returns an error for a bad key or
// permit func answer (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidLimit),
// a done ctx, a Redis failure (wrapping tierlimit.ErrMisconfigured when
// Redis refuses the script), or after Close (tierlimit.ErrClosed).
func (c *Concurrency) TryAcquire(ctx context.Context, key string) (tierlimit.Permit, bool, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, false, err
	}
	if n == 0 {
		return permit.Blocked(&c.stats, c.onPermit)
	}
	p, ok, err := c.try(ctx, key, n)
	if err != nil {
		return tierlimit.Permit{}, false, err
	}
	permit.Report(c.onPermit, ok, tierlimit.SourceRemote, 0)
	if !ok {
		c.stats.Refused.Add(1)
	}
	return p, ok, nil
}

// Acquire returns a permit of key, waiting for one until ctx is done: it
// asks Redis again after a random wait that doubles up to a bound, and at
// once when a permit of the key is released in this process. It fails at
// once when ctx is done or its deadline has passed. Its errors are
// TryAcquire's, and ctx's error when it gives up waiting.
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
		p, ok, err := c.try(ctx, key, n)
		return p, ok, tierlimit.SourceRemote, err
	})
}

// Close stops renewing permits and makes every later call, and every
// Acquire waiting, return tierlimit.ErrClosed. Permits held stay valid
// until their TTL and may be released. It does not wait for Redis: a
// renewal in flight goes on until the client gives it up. It is
// idempotent and returns nil.
func (c *Concurrency) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.hold.Drop()
	c.wg.Wait()
	return nil
}

// Stats returns the limiter's counters. Expired counts permits whose
// renewal found them gone from Redis.
func (c *Concurrency) Stats() tierlimit.ConcurrencyStats { return c.stats.Read() }

// check checks a call's input and returns the key's number of permits.
func (c *Concurrency) check(ctx context.Context, key string) (int64, error) {
	return permit.Check(ctx, "remote", c.isClosed(), key, c.n, c.fn)
}

func (c *Concurrency) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// try asks Redis for one permit of key: ok false if none is free. It
// returns by ctx's end (detach.CallOrphan): a permit Redis grants once the
// caller has gone is given back, as is one whose reply was lost (giving
// back a permit never granted does nothing).
func (c *Concurrency) try(ctx context.Context, key string, n int64) (p tierlimit.Permit, ok bool, err error) {
	keys := store.PermitKeys(c.prefix, key)
	holder := c.id + ":" + strconv.FormatUint(c.seq.Add(1), 36)
	got, err := detach.CallOrphan(c.honours, ctx, func(ctx context.Context) (int64, error) {
		got, _, err := store.SetPermits(ctx, c.rdb, keys, holder, 1, n, c.ttl, false)
		return got, err
	}, func(got int64, err error) {
		if err != nil || got > 0 {
			// Granted, or perhaps granted: a lost reply tells nothing.
			c.giveBack(key, holder)
		}
	})
	if err != nil {
		return p, false, c.redisErr(err)
	}
	if got == 0 {
		return p, false, nil
	}
	c.mu.Lock()
	h := c.held[key]
	if h == nil {
		h = &heldKey{keys: keys, holders: make(map[string]struct{})}
		c.held[key] = h
	}
	h.holders[holder] = struct{}{}
	idx, gen := c.out.Put(held{key, holder})
	c.mu.Unlock()
	c.stats.Acquired.Add(1)
	c.stats.InUse.Add(1)
	return tierlimit.NewPermit((*permits)(c), uint64(idx), gen), true, nil
}

// redisErr names a Redis failure as the caller sees it.
func (c *Concurrency) redisErr(err error) error {
	if tierlimit.Misconfigured(err) {
		return fmt.Errorf("remote: %w: %w", tierlimit.ErrMisconfigured, err)
	}
	return check.Named("remote", err)
}

// release takes p out of the renewals and gives it back to Redis, unless
// its renewal found it expired.
func (c *Concurrency) release(p held) {
	c.stats.InUse.Add(-1)
	c.mu.Lock()
	h := c.held[p.key]
	_, live := h.holdersOf()[p.holder]
	if live {
		delete(h.holders, p.holder)
		if len(h.holders) == 0 {
			delete(c.held, p.key)
		}
	}
	c.mu.Unlock()
	if !live {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(c.ttl, releaseTimeout))
	defer cancel()
	_, _ = detach.Call(c.honours, ctx, func(context.Context) (struct{}, error) {
		c.giveBack(p.key, p.holder)
		return struct{}{}, nil
	})
}

// giveBack gives holder's permit of key back to Redis, waiting for it at
// most releaseTimeout when the client honours deadlines, then wakes the
// key's longest waiter in this process. A failure leaves the permit to its
// TTL: nobody renews it now.
func (c *Concurrency) giveBack(key, holder string) {
	ctx, cancel := context.WithTimeout(context.Background(), min(c.ttl, releaseTimeout))
	defer cancel()
	_, _, _ = store.SetPermits(ctx, c.rdb, store.PermitKeys(c.prefix, key), holder, 0, 1, c.ttl, false)
	c.queue.Wake(key)
}

func (h *heldKey) holdersOf() map[string]struct{} {
	if h == nil {
		return nil
	}
	return h.holders
}

// renewLoop renews the permits held every third of the TTL until Close.
func (c *Concurrency) renewLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			c.renew()
		}
	}
}

// renew extends every held permit's TTL in one pipeline, recording again
// those Redis lost (counted in Stats().Expired).
func (c *Concurrency) renew() {
	c.mu.Lock()
	rs := make([]store.Renewal, 0, len(c.held))
	names := make([]string, 0, len(c.held))
	for key, h := range c.held {
		// A permit Redis lost (a flush, a restart from empty, eviction, or
		// its expiry while renewals could not reach Redis) is recorded
		// again: its request is in flight.
		r := store.Renewal{Keys: h.keys, Holders: make([]string, 0, len(h.holders)), Want: make([]int64, 0, len(h.holders))}
		for holder := range h.holders {
			r.Holders = append(r.Holders, holder)
			r.Want = append(r.Want, 1)
		}
		rs = append(rs, r)
		names = append(names, key)
	}
	c.mu.Unlock()
	if len(rs) == 0 {
		return
	}
	// The renewal is waited for a third of the TTL at most, and not once
	// Close has begun: the call goes on on its own goroutine.
	ctx, cancel := context.WithTimeout(context.Background(), c.ttl/3)
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := detach.Call(false, ctx, // Close cancels ctx: not a deadline
		func(ctx context.Context) (struct{}, error) {
			store.RenewPermits(ctx, c.rdb, c.ttl, rs)
			return struct{}{}, nil
		}); err != nil {
		return // the next tick tries again; the TTL leaves two
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range rs {
		if r.Err != nil {
			continue // the next tick tries again; the TTL leaves two
		}
		h := c.held[names[i]]
		for j, holder := range r.Holders {
			if _, ok := h.holdersOf()[holder]; ok && r.Counts[j] <= 0 {
				c.stats.Expired.Add(1)
			}
			if _, ok := h.holdersOf()[holder]; ok && r.Counts[j] == 0 {
				delete(h.holders, holder)
			}
		}
		if h != nil && len(h.holders) == 0 {
			delete(c.held, names[i])
		}
	}
}

var _ tierlimit.Concurrency = (*Concurrency)(nil)
