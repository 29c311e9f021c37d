package remote

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/store"
)

// limiter is what every limiter of the package is: the engine that runs
// its script (internal/store), behind the methods users call.
type limiter struct{ s *store.Limiter }

func newLimiter(rdb redis.UniversalClient, alg *store.Algorithm, limit tierlimit.Limit, opts []Option) (*limiter, error) {
	var cfg store.Config
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: remote: nil option", tierlimit.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	s, err := store.New(rdb, alg, limit, cfg)
	if err != nil {
		return nil, err
	}
	return &limiter{s}, nil
}

// AllowN reports whether n events may happen now for key, and charges them
// if so. n == 0 peeks: it charges nothing and is always allowed, with
// Remaining telling what is left.
func (l *limiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	return l.s.AllowN(ctx, key, n)
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *limiter) Allow(ctx context.Context, key string) (tierlimit.Result, error) {
	return l.s.AllowN(ctx, key, 1)
}

// Reset forgets key's state under every limit: the key is back to full capacity.
func (l *limiter) Reset(ctx context.Context, key string) error { return l.s.Reset(ctx, key) }

// Eviction returns what the Redis server said about evicting keys when last
// read: at New (within a second), then about once a minute while the
// limiter is used, on a goroutine of its own. Each reading that differs in
// risk is reported to WithObserver's Eviction, and logged (log/slog) when
// it becomes risky or unknown.
func (l *limiter) Eviction() tierlimit.EvictionRisk { return l.s.Eviction() }
