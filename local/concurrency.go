package local

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/check"
	"github.com/tierlimit/tierlimit/internal/front"
	"github.com/tierlimit/tierlimit/internal/permit"
)

// Concurrency limits how many requests per key are in flight at once in
// this process: at most N permits of a key are out at any time. Waiters
// are served in arrival order: a permit given back goes straight to the
// longest waiter of its key, so a stream of TryAcquire calls cannot starve
// an Acquire. A key with no permit out and no waiter takes no memory.
//
// A Concurrency is safe for concurrent use. It must not be copied after
// first use. For a limit shared by a fleet, use the remote or hybrid
// packages.
type Concurrency struct {
	n      int64
	fn     tierlimit.PermitFunc
	closed atomic.Bool
	done   chan struct{} // closed by Close: waiters give up
	// onPermit is WithPermitObserver's, or nil.
	onPermit func(tierlimit.PermitDecision)
	close    sync.Once
	stats    permit.Stats
	shards   [concShards]concShard
}

// concShards spreads keys over locks, so that callers of different keys
// seldom meet on one.
const concShards = 64

type concShard struct {
	mu    sync.Mutex
	keys  map[string]*concKey
	slab  permit.Slab[string] // the permits out, by key: a permit's id is its shard and its index here
	spare *concKey            // the last entry forgotten, for the next new key: a warm key that comes and goes allocates none (BenchmarkPermit)
	// The shard's counters, under mu, which their updates hold anyway:
	// shared atomics would be contended cache lines (BenchmarkPermit).
	acquired, inUse int64
	_               [32]byte // a shard per two cache lines
}

// concKey is one key's permits: how many are out and who waits, oldest
// first. A waiter's channel receives the permit handed to it.
type concKey struct {
	key     string
	out     int64
	waiters []chan struct{}
}

// entry returns key's entry in s, made if there is none. It is called
// with s.mu held.
func (c *Concurrency) entry(s *concShard, key string) *concKey {
	k := s.keys[key]
	if k == nil {
		k = s.spare
		s.spare = nil
		if k == nil {
			k = &concKey{}
		}
		k.key = key
		s.keys[key] = k
	}
	return k
}

// forget drops key's entry k from s. It is called with s.mu held.
func (s *concShard) forget(key string, k *concKey) {
	delete(s.keys, key)
	k.key, k.out, k.waiters = "", 0, nil
	s.spare = k
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
// it has more out keeps them until they are released, and gives out no
// more until it is under the new number.
func WithPermitFunc(f tierlimit.PermitFunc) ConcurrencyOption {
	return concurrencyOption(func(c *Concurrency) (err error) {
		c.fn, err = permit.Func(f)
		return err
	})
}

// NewConcurrency returns a limiter of n permits per key (1 to
// tierlimit.MaxPermits; an error wrapping tierlimit.ErrInvalidLimit
// otherwise, tierlimit.ErrInvalidOption for a bad option).
func NewConcurrency(n int64, opts ...ConcurrencyOption) (*Concurrency, error) {
	if err := tierlimit.CheckPermits(n); err != nil {
		return nil, check.Named("local", err)
	}
	c := &Concurrency{n: n, done: make(chan struct{})}
	if err := permit.Apply(opts, func(o ConcurrencyOption) error { return o.applyConcurrency(c) }); err != nil {
		return nil, check.Named("local", err)
	}
	for i := range c.shards {
		c.shards[i].keys = make(map[string]*concKey)
	}
	return c, nil
}

// permits is a Concurrency as its permits' releaser: ReleasePermit is
// not part of Concurrency's API.
type permits Concurrency

// ReleasePermit gives back permit (id, gen): to its key's longest waiter,
// if any. A generation not the record's (released already) does nothing.
func (r *permits) ReleasePermit(id, gen uint64) {
	c := (*Concurrency)(r)
	if id>>32 >= concShards {
		return
	}
	s := &c.shards[id>>32]
	s.mu.Lock()
	key, ok := s.slab.Take(uint32(id), gen)
	if ok {
		c.releaseLocked(s, key, false)
	}
	s.mu.Unlock()
}

// give records a permit of key out of shard i, s, and returns it. It is
// called with s.mu held.
func (c *Concurrency) give(i uint64, s *concShard, key string) tierlimit.Permit {
	idx, gen := s.slab.Put(key)
	return tierlimit.NewPermit((*permits)(c), i<<32|uint64(idx), gen)
}

// TryAcquire returns a permit of key if one is free, without waiting. It
// returns ok false when the key has all its permits out (or waiters ahead),
// and an error only for a bad key or permit func answer
// (tierlimit.ErrInvalidKey, tierlimit.ErrInvalidLimit), a done ctx, or
// after Close (tierlimit.ErrClosed).
func (c *Concurrency) TryAcquire(ctx context.Context, key string) (tierlimit.Permit, bool, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, false, err
	}
	if n == 0 {
		return permit.Blocked(&c.stats, c.onPermit)
	}
	i, s := c.shard(key)
	s.mu.Lock()
	k := c.entry(s, key)
	if k.out >= n || len(k.waiters) > 0 {
		if k.out == 0 && len(k.waiters) == 0 {
			s.forget(key, k)
		}
		s.mu.Unlock()
		c.stats.Refused.Add(1)
		permit.Report(c.onPermit, false, tierlimit.SourceLocal, 0)
		return tierlimit.Permit{}, false, nil
	}
	k.out++
	s.acquired++
	s.inUse++
	p := c.give(i, s, key)
	s.mu.Unlock()
	permit.Report(c.onPermit, true, tierlimit.SourceLocal, 0)
	return p, true, nil
}

// Acquire returns a permit of key, waiting its turn for one until ctx is
// done. It fails at once when ctx is done or its deadline has passed. Its
// errors are TryAcquire's, and ctx's error when it gives up waiting.
func (c *Concurrency) Acquire(ctx context.Context, key string) (tierlimit.Permit, error) {
	n, err := c.check(ctx, key)
	if err != nil {
		return tierlimit.Permit{}, err
	}
	if n == 0 {
		permit.Report(c.onPermit, false, tierlimit.SourceBlocked, 0)
		return tierlimit.Permit{}, tierlimit.ErrWaitDeadline // no permit will ever be free
	}
	i, s := c.shard(key)
	s.mu.Lock()
	k := c.entry(s, key)
	if k.out < n && len(k.waiters) == 0 {
		k.out++
		s.acquired++
		s.inUse++
		p := c.give(i, s, key)
		s.mu.Unlock()
		permit.Report(c.onPermit, true, tierlimit.SourceLocal, 0)
		return p, nil
	}
	start := time.Now()
	ch := make(chan struct{}, 1)
	k.waiters = append(k.waiters, ch)
	s.mu.Unlock()
	c.stats.Waiting.Add(1)
	defer c.stats.Waiting.Add(-1)
	select {
	case <-ch: // counted by the release that handed it over
		s.mu.Lock()
		p := c.give(i, s, key)
		s.mu.Unlock()
		permit.Report(c.onPermit, true, tierlimit.SourceLocal, time.Since(start))
		return p, nil
	case <-ctx.Done():
		permit.Report(c.onPermit, false, tierlimit.SourceLocal, time.Since(start))
		return tierlimit.Permit{}, c.giveUp(key, ch, ctx.Err())
	case <-c.done:
		return tierlimit.Permit{}, c.giveUp(key, ch, tierlimit.ErrClosed)
	}
}

// Close makes every later call return tierlimit.ErrClosed, and every
// Acquire waiting return it at once. Permits out stay valid and may be
// released. It is idempotent and returns nil.
func (c *Concurrency) Close() error {
	c.close.Do(func() {
		c.closed.Store(true)
		close(c.done)
	})
	return nil
}

// giveUp ends waiter ch of key, which stops waiting with err: a permit
// handed to it meanwhile goes on to the next waiter.
func (c *Concurrency) giveUp(key string, ch chan struct{}, err error) error {
	if !c.leave(key, ch) {
		_, s := c.shard(key)
		s.mu.Lock()
		c.releaseLocked(s, key, true)
		s.mu.Unlock()
	}
	return err
}

// Stats returns the limiter's counters (Expired is always 0: a local
// permit does not expire).
func (c *Concurrency) Stats() tierlimit.ConcurrencyStats {
	st := c.stats.Read()
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Acquired += s.acquired
		st.InUse += s.inUse
		s.mu.Unlock()
	}
	return st
}

// check checks a call's input and returns the key's number of permits.
func (c *Concurrency) check(ctx context.Context, key string) (int64, error) {
	return permit.Check(ctx, "local", c.closed.Load(), key, c.n, c.fn)
}

// shard returns key's shard and its index.
func (c *Concurrency) shard(key string) (uint64, *concShard) {
	i := front.Hash(key) % concShards
	return i, &c.shards[i]
}

// releaseLocked gives back one permit of key, in shard s: to its longest
// waiter, which then holds it, or to the key, which is forgotten once
// nothing is out. undo says the permit was handed to a waiter that gave
// up: it was never acquired. It is called with s.mu held.
func (c *Concurrency) releaseLocked(s *concShard, key string, undo bool) {
	s.inUse--
	if undo {
		s.acquired--
	}
	k := s.keys[key]
	if k == nil {
		return // cannot happen: a permit out keeps its key
	}
	if len(k.waiters) > 0 {
		ch := k.waiters[0]
		k.waiters = k.waiters[1:]
		s.acquired++
		s.inUse++
		ch <- struct{}{}
		return
	}
	k.out--
	if k.out <= 0 {
		s.forget(key, k)
	}
}

// leave takes waiter ch out of key's queue and reports whether it was
// there (false: a permit was handed to it meanwhile).
func (c *Concurrency) leave(key string, ch chan struct{}) bool {
	_, s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil {
		return false
	}
	for i, w := range k.waiters {
		if w == ch {
			k.waiters = append(k.waiters[:i:i], k.waiters[i+1:]...)
			if k.out == 0 && len(k.waiters) == 0 {
				s.forget(key, k)
			}
			return true
		}
	}
	return false
}

var _ tierlimit.Concurrency = (*Concurrency)(nil)
