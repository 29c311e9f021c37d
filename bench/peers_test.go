package bench

import (
	"context"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/remote"
)

// baseline names the peer every other limiter is measured against.
const baseline = "redis_rate"

// allowFunc asks for one event for key. Benchmarks and tests call every
// limiter through it, so each pays the same indirect call.
type allowFunc func(ctx context.Context, key string) (allowed bool, remaining int64, err error)

// peer is one limiter under comparison.
type peer struct {
	name  string
	build func(rdb *redis.Client, l tierlimit.Limit) (allowFunc, error)
}

// peers lists our six remote limiters, then the baseline.
var peers = []peer{
	{"tokenbucket", ours(remote.NewTokenBucket)},
	{"gcra", ours(remote.NewGCRA)},
	{"fixedwindow", ours(remote.NewFixedWindow)},
	{"anchoredwindow", ours(remote.NewAnchoredWindow)},
	{"slidinglog", ours(remote.NewSlidingLog)},
	{"slidingwindow", ours(remote.NewSlidingWindow)},
	{baseline, redisRate},
}

// ours adapts a remote constructor.
func ours[L tierlimit.Limiter](newL func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (L, error)) func(*redis.Client, tierlimit.Limit) (allowFunc, error) {
	return func(rdb *redis.Client, l tierlimit.Limit) (allowFunc, error) {
		lim, err := newL(rdb, l)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, key string) (bool, int64, error) {
			res, err := lim.AllowN(ctx, key, 1)
			return res.Allowed, res.Remaining, err
		}, nil
	}
}

// redisRate adapts github.com/go-redis/redis_rate, a GCRA in one Lua script,
// to the same limit (its Burst is our Capacity).
func redisRate(rdb *redis.Client, l tierlimit.Limit) (allowFunc, error) {
	lim := redis_rate.NewLimiter(rdb)
	rl := redis_rate.Limit{Rate: int(l.Rate), Burst: int(l.Capacity()), Period: l.Period}
	return func(ctx context.Context, key string) (bool, int64, error) {
		res, err := lim.Allow(ctx, key, rl)
		if err != nil {
			return false, 0, err
		}
		return res.Allowed > 0, int64(res.Remaining), nil
	}, nil
}
