// Package local provides an in-process keyed rate limiter: one token bucket
// per key, exact in integer arithmetic for every limit tierlimit.Limit
// accepts (golang.org/x/time/rate's bucket, without its float64 rounding),
// held in a ristretto cache bounded by a maximum number of keys.
//
// Memory is bounded by WithMaxKeys: when more keys arrive, ristretto's
// admission policy keeps the most frequently used ones and evicts (or
// refuses) the rest. An evicted key forgets its state: it starts again with a
// full bucket, so a key that keeps getting evicted may be admitted more than
// its limit. Size MaxKeys above the number of keys active within one Period.
//
// Decisions are per process: N processes each admit the whole limit. For a
// limit shared by a fleet, use the remote or hybrid packages.
package local

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/dgraph-io/ristretto/v2"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/gate"
	"github.com/tierlimit/tierlimit/internal/xrate"
)

// DefaultMaxKeys is the number of keys a Limiter holds unless WithMaxKeys
// says otherwise.
const DefaultMaxKeys = 100_000

// Clock tells the time; WithClock injects one (tests step it). It is
// tierlimit.Clock.
type Clock = tierlimit.Clock

// Option configures a Limiter.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	maxKeys int64
	clock   Clock
}

// maxMaxKeys bounds WithMaxKeys: ristretto allocates its admission
// counters up front, about 48 bytes per key, whether or not the keys come.
const maxMaxKeys = 1 << 24

// WithMaxKeys bounds the number of keys held (default DefaultMaxKeys): from
// 1 to 2^24 (16,777,216). New allocates about 48 bytes per key of the bound
// up front (ristretto's admission counters), 768 MiB at the largest.
func WithMaxKeys(n int64) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > maxMaxKeys {
			return fmt.Errorf("%w: local: max keys %d must be between 1 and %d", tierlimit.ErrInvalidOption, n, maxMaxKeys)
		}
		c.maxKeys = n
		return nil
	})
}

// WithClock sets the clock decisions are made on (default: time.Now).
func WithClock(clock Clock) Option {
	return optionFunc(func(c *config) error {
		if clock == nil {
			return fmt.Errorf("%w: local: nil clock", tierlimit.ErrInvalidOption)
		}
		c.clock = clock
		return nil
	})
}

// Limiter is an in-process keyed rate limiter. It is safe for concurrent use
// and must not be copied. Close releases its cache; after it, every method
// returns tierlimit.ErrClosed.
type Limiter struct {
	setting atomic.Pointer[setting]
	clock   Clock
	cache   *ristretto.Cache[string, *bucket]
	gate    gate.Gate // the calls using cache, which Close waits for

	// stripes serialise the creation of a key's bucket, so that concurrent
	// first calls share one bucket.
	stripes [64]sync.Mutex
}

// setting is the limit every key follows. SetLimit replaces it whole; gen
// tells buckets made under an older one.
type setting struct {
	limit tierlimit.Limit
	gen   uint64
}

// bucket is one key's token bucket and the generation of the setting it
// follows.
type bucket struct {
	lim *xrate.Bucket
	gen atomic.Uint64
}

// New returns a Limiter enforcing limit for every key. It returns an error
// wrapping tierlimit.ErrInvalidLimit or tierlimit.ErrInvalidOption.
func New(limit tierlimit.Limit, opts ...Option) (*Limiter, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	cfg := config{maxKeys: DefaultMaxKeys, clock: tierlimit.SystemClock{}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: local: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	cache, err := ristretto.NewCache(&ristretto.Config[string, *bucket]{
		NumCounters:        cfg.maxKeys * 10,
		MaxCost:            cfg.maxKeys,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: local: %v", tierlimit.ErrInvalidOption, err)
	}
	l := &Limiter{clock: cfg.clock, cache: cache}
	l.setting.Store(newSetting(limit, 0))
	return l, nil
}

func checkLimit(limit tierlimit.Limit) error {
	if err := limit.Validate(); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	return nil
}

func newSetting(limit tierlimit.Limit, gen uint64) *setting {
	return &setting{limit: limit, gen: gen}
}

// Limit returns the limit every key is held to.
func (l *Limiter) Limit() tierlimit.Limit { return l.setting.Load().limit }

// SetLimit changes the limit of every key, those already held included:
// each keeps the tokens it has (capped at the new burst) and refills at the
// new rate from its next call on. It returns an error wrapping
// tierlimit.ErrInvalidLimit for a bad limit, and then changes nothing, and
// tierlimit.ErrClosed after Close.
func (l *Limiter) SetLimit(limit tierlimit.Limit) error {
	if l.gate.Closed() {
		return tierlimit.ErrClosed
	}
	if err := checkLimit(limit); err != nil {
		return err
	}
	for {
		old := l.setting.Load()
		if old.limit == limit {
			return nil
		}
		if l.setting.CompareAndSwap(old, newSetting(limit, old.gen+1)) {
			return nil
		}
	}
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and takes them if
// so. n == 0 peeks. ctx is accepted for the tierlimit.Limiter interface and
// ignored: no call waits. Errors wrap tierlimit.ErrInvalidKey or
// tierlimit.ErrInvalidCost; after Close it returns tierlimit.ErrClosed.
func (l *Limiter) AllowN(_ context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := tierlimit.CheckKey(key); err != nil {
		return tierlimit.Result{}, err
	}
	h := xxhash.Sum64String(key)
	if !l.gate.Enter(h) {
		return tierlimit.Result{}, tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	set := l.setting.Load()
	if err := set.limit.CheckCost(n); err != nil {
		return tierlimit.Result{}, err
	}
	now := l.clock.Now()
	b := l.bucket(key, h, set, now)
	if b.gen.Load() != set.gen {
		// A SetLimit since this bucket last decided: it follows the new
		// limit from now on (a second SetLimit to the same limit, from a
		// concurrent call, changes nothing).
		b.lim.SetLimit(now, set.limit)
		b.gen.Store(set.gen)
	}
	return b.lim.Decide(now, n), nil
}

// Reset forgets key: its next call starts with a full bucket. It returns
// tierlimit.ErrClosed after Close.
func (l *Limiter) Reset(_ context.Context, key string) error {
	if err := tierlimit.CheckKey(key); err != nil {
		return err
	}
	h := xxhash.Sum64String(key)
	if !l.gate.Enter(h) {
		return tierlimit.ErrClosed
	}
	defer l.gate.Exit(h)
	l.cache.Del(key)
	l.cache.Wait()
	return nil
}

// Close waits for the calls in flight, then releases the cache and its
// goroutines. It is safe to call twice, and concurrently with any method.
func (l *Limiter) Close() error {
	if l.gate.Close() {
		l.cache.Close()
	}
	return nil
}

func (l *Limiter) bucket(key string, h uint64, set *setting, now time.Time) *bucket {
	if b, ok := l.cache.Get(key); ok {
		return b
	}
	mu := &l.stripes[h%uint64(len(l.stripes))]
	mu.Lock()
	defer mu.Unlock()
	if b, ok := l.cache.Get(key); ok {
		return b
	}
	b := &bucket{lim: xrate.New(set.limit, now)}
	b.gen.Store(set.gen)
	// Set may be refused by the admission policy: the bucket then serves
	// this call only, as if evicted at once.
	if l.cache.Set(key, b, 1) {
		l.cache.Wait()
	}
	return b
}
