package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// allower is what every tier's limiter offers the server.
type allower interface {
	AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
}

// defaultLimit is the limit the limiters are built with. Every key's limit
// comes from its rule (limitFunc), which never answers the zero Limit, so
// this one decides nothing; all replicas use the same, which hybrid
// requires of limiters that share a prefix.
var defaultLimit = tierlimit.PerSecond(1)

// tiers holds one limiter per tier and remote algorithm; each serves the
// keys of every rule of its kind, with the rule's limit (limitFunc).
// It is safe for concurrent use.
type tiers struct {
	rdb        redis.UniversalClient
	hybrid     *hybrid.Limiter
	local      *local.Limiter
	remoteOpts []remote.Option
	limitFunc  func(Tier, Algorithm) tierlimit.LimitFunc

	mu sync.Mutex // serializes the creation of remote limiters
	// remote maps an algorithm to its limiter, copied on write so that
	// decisions read it without a lock.
	remote atomic.Pointer[map[Algorithm]allower]
}

func newTiers(rdb redis.UniversalClient, limitFunc func(Tier, Algorithm) tierlimit.LimitFunc,
	hopts []hybrid.Option, lopts []local.Option, ropts []remote.Option) (*tiers, error) {
	t := &tiers{rdb: rdb, limitFunc: limitFunc, remoteOpts: ropts}
	t.remote.Store(&map[Algorithm]allower{})
	h, err := hybrid.New(rdb, defaultLimit,
		append([]hybrid.Option{hybrid.WithLimitFunc(limitFunc(TierHybrid, AlgoTokenBucket))}, hopts...)...)
	if err != nil {
		return nil, err
	}
	l, err := local.New(defaultLimit,
		append([]local.Option{local.WithLimitFunc(limitFunc(TierLocal, AlgoTokenBucket))}, lopts...)...)
	if err != nil {
		h.Close()
		return nil, err
	}
	t.hybrid, t.local = h, l
	return t, nil
}

// ensure builds the remote limiters of the algorithms c uses that do not
// exist yet. Each constructor reads Redis's eviction settings once,
// waiting at most remote.NewTimeout.
func (t *tiers) ensure(c *Config) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.remote.Load()
	var next map[Algorithm]allower
	for a := range c.algorithms() {
		if cur[a] != nil {
			continue
		}
		lim, err := t.newRemote(a)
		if err != nil {
			return fmt.Errorf("serve: remote %s limiter: %w", a, err)
		}
		if next == nil {
			next = make(map[Algorithm]allower, len(cur)+1)
			for k, v := range cur {
				next[k] = v
			}
		}
		next[a] = lim
	}
	if next != nil {
		t.remote.Store(&next)
	}
	return nil
}

func (t *tiers) newRemote(a Algorithm) (allower, error) {
	opts := append([]remote.Option{remote.WithLimitFunc(t.limitFunc(TierRemote, a))}, t.remoteOpts...)
	switch a {
	case AlgoTokenBucket:
		return remote.NewTokenBucket(t.rdb, defaultLimit, opts...)
	case AlgoGCRA:
		return remote.NewGCRA(t.rdb, defaultLimit, opts...)
	case AlgoFixedWindow:
		return remote.NewFixedWindow(t.rdb, defaultLimit, opts...)
	case AlgoAnchoredWindow:
		return remote.NewAnchoredWindow(t.rdb, defaultLimit, opts...)
	case AlgoSlidingWindow:
		return remote.NewSlidingWindow(t.rdb, defaultLimit, opts...)
	case AlgoSlidingLog:
		return remote.NewSlidingLog(t.rdb, defaultLimit, opts...)
	}
	return nil, fmt.Errorf("unknown algorithm %q", a)
}

// of returns the limiter of a rule's tier and algorithm.
func (t *tiers) of(tier Tier, a Algorithm) allower {
	switch tier {
	case TierHybrid:
		return t.hybrid
	case TierLocal:
		return t.local
	}
	return (*t.remote.Load())[a]
}

// close gives the hybrid leases back to Redis and stops the limiters'
// goroutines.
func (t *tiers) close() error {
	return errors.Join(t.hybrid.Close(), t.local.Close())
}
