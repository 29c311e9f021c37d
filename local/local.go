// Package local provides an in-process keyed rate limiter: one
// golang.org/x/time/rate token bucket per key, held in a ristretto cache
// bounded by a maximum number of keys.
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
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/dgraph-io/ristretto/v2"
	"github.com/tierlimit/tierlimit"
	"golang.org/x/time/rate"
)

// DefaultMaxKeys is the number of keys a Limiter holds unless WithMaxKeys
// says otherwise.
const DefaultMaxKeys = 100_000

// Clock tells the time; WithClock injects one (tests step it).
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

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

// WithMaxKeys bounds the number of keys held (default DefaultMaxKeys, at least 1).
func WithMaxKeys(n int64) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > math.MaxInt64/16 {
			return fmt.Errorf("%w: local: max keys %d must be between 1 and %d", tierlimit.ErrInvalidOption, n, int64(math.MaxInt64/16))
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
// and must not be copied. Close releases its cache.
type Limiter struct {
	limit tierlimit.Limit
	every rate.Limit
	burst int
	clock Clock
	cache *ristretto.Cache[string, *rate.Limiter]

	// stripes serialise the creation of a key's bucket, so that concurrent
	// first calls share one bucket.
	stripes [64]sync.Mutex
}

// New returns a Limiter enforcing limit for every key. It returns an error
// wrapping tierlimit.ErrInvalidLimit or tierlimit.ErrInvalidOption.
func New(limit tierlimit.Limit, opts ...Option) (*Limiter, error) {
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	if limit.Capacity() > math.MaxInt {
		// x/time/rate takes the burst as an int: 32 bits on some platforms.
		return nil, fmt.Errorf("%w: local: burst %d is above %d", tierlimit.ErrInvalidLimit, limit.Capacity(), math.MaxInt)
	}
	cfg := config{maxKeys: DefaultMaxKeys, clock: systemClock{}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: local: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	cache, err := ristretto.NewCache(&ristretto.Config[string, *rate.Limiter]{
		NumCounters:        cfg.maxKeys * 10,
		MaxCost:            cfg.maxKeys,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: local: %v", tierlimit.ErrInvalidOption, err)
	}
	return &Limiter{
		limit: limit,
		every: rate.Limit(float64(limit.Rate) / limit.Period.Seconds()),
		burst: int(limit.Capacity()),
		clock: cfg.clock,
		cache: cache,
	}, nil
}

// Limit returns the limit every key is held to.
func (l *Limiter) Limit() tierlimit.Limit { return l.limit }

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events may happen now for key, and takes them if
// so. n == 0 peeks. ctx is accepted for the tierlimit.Limiter interface and
// ignored: no call waits. Errors wrap tierlimit.ErrInvalidKey or
// tierlimit.ErrInvalidCost.
func (l *Limiter) AllowN(_ context.Context, key string, n int64) (tierlimit.Result, error) {
	if err := tierlimit.CheckKey(key); err != nil {
		return tierlimit.Result{}, err
	}
	if err := l.limit.CheckCost(n); err != nil {
		return tierlimit.Result{}, err
	}
	now := l.clock.Now()
	return l.decide(l.bucket(key), now, n), nil
}

// Reset forgets key: its next call starts with a full bucket.
func (l *Limiter) Reset(_ context.Context, key string) error {
	if err := tierlimit.CheckKey(key); err != nil {
		return err
	}
	l.cache.Del(key)
	l.cache.Wait()
	return nil
}

// Close releases the cache and its goroutines. It is safe to call twice.
func (l *Limiter) Close() error {
	l.cache.Close()
	return nil
}

func (l *Limiter) bucket(key string) *rate.Limiter {
	if b, ok := l.cache.Get(key); ok {
		return b
	}
	mu := &l.stripes[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if b, ok := l.cache.Get(key); ok {
		return b
	}
	b := rate.NewLimiter(l.every, l.burst)
	// Set may be refused by the admission policy: the bucket then serves
	// this call only, as if evicted at once.
	if l.cache.Set(key, b, 1) {
		l.cache.Wait()
	}
	return b
}

func (l *Limiter) decide(b *rate.Limiter, now time.Time, n int64) tierlimit.Result {
	res := tierlimit.Result{Limit: l.limit, Source: tierlimit.SourceLocal}
	res.Allowed = n == 0 || b.AllowN(now, int(n))
	tokens := b.TokensAt(now)
	res.Remaining = int64(math.Max(0, math.Floor(tokens)))
	if !res.Allowed {
		res.RetryAfter = l.wait(float64(n) - tokens)
	}
	res.ResetAfter = l.wait(float64(l.burst) - tokens)
	return res
}

// wait returns the time to refill tokens, rounded up to the microsecond.
func (l *Limiter) wait(tokens float64) time.Duration {
	if tokens <= 0 {
		return 0
	}
	d := time.Duration(math.Ceil(tokens / float64(l.every) * 1e6))
	return d * time.Microsecond
}

func stripe(key string) int { return int(xxhash.Sum64String(key) % 64) }
