package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
	ulule "github.com/ulule/limiter/v3"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"
)

// unknownRemaining is what an allowFunc returns as remaining when its
// limiter does not say, or saying would cost the benchmark extra work.
const unknownRemaining = -1

// fixture is one built limiter: allow decides, close releases it.
// fallbacks, when set, counts the decisions made so far without the
// limiter's real backend (hybrid's in-process fallback while Redis is slow
// or unreachable), which measure something else.
type fixture struct {
	allow     allowFunc
	close     func() error
	fallbacks func() int64
}

// placement says where a contender decides.
type placement int

const (
	inProcess placement = iota // in memory, never Redis
	leased                     // in memory, on tokens leased from Redis (hybrid)
	perCall                    // in Redis, one or more round trips per decision
)

// contender is a limiter of BenchmarkCompare and TestPeersAgree. Every
// contender is built from the same tierlimit.Limit, converted to its own
// vocabulary; a limit it cannot express is an error, never an approximation.
type contender struct {
	name  string
	where placement
	// perKey is false for the one contender that ignores keys (a single
	// x/time/rate limiter), which runs in the hot-key scenario only.
	perKey bool
	// build gets a client when where is not inProcess, else nil.
	build func(rdb *redis.Client, l tierlimit.Limit) (fixture, error)
}

// contenders are ours (local, hybrid, tokenbucket, gcra), then the peers:
// in process first, then on Redis. The names are the last element of the
// sub-benchmark names, which run.sh, cmd/compare and docs/comparison.md use.
var contenders = []contender{
	{"local", inProcess, true, buildLocal},
	{"hybrid", leased, true, buildHybridFixture},
	{"tokenbucket", perCall, true, fromPeer(ours(remote.NewTokenBucket))},
	{"gcra", perCall, true, fromPeer(ours(remote.NewGCRA))},
	{"xrate", inProcess, false, buildXrate},
	{"syncmap_xrate", inProcess, true, buildSyncMapXrate},
	{"sethvargo_memory", inProcess, true, buildSethvargo},
	{"ulule_memory", inProcess, true, buildUluleMemory},
	{"ulule_redis", perCall, true, buildUluleRedis},
	{"throttled_redis", perCall, true, buildThrottledRedis},
	{baseline, perCall, true, fromPeer(redisRate)},
}

// fromPeer adapts a peer builder of BenchmarkRemote, which has nothing to
// release.
func fromPeer(build func(*redis.Client, tierlimit.Limit) (allowFunc, error)) func(*redis.Client, tierlimit.Limit) (fixture, error) {
	return func(rdb *redis.Client, l tierlimit.Limit) (fixture, error) {
		allow, err := build(rdb, l)
		return fixture{allow, func() error { return nil }, nil}, err
	}
}

// errNoBurst is returned for peers whose bucket size is always their rate.
var errNoBurst = errors.New("peer has no burst separate from its rate")

func buildLocal(_ *redis.Client, l tierlimit.Limit) (fixture, error) {
	lim, err := local.New(l)
	if err != nil {
		return fixture{}, err
	}
	return fixture{func(ctx context.Context, key string) (bool, int64, error) {
		r, err := lim.Allow(ctx, key)
		return r.Allowed, r.Remaining, err
	}, lim.Close, nil}, nil
}

// buildHybridFixture builds hybrid with its defaults.
func buildHybridFixture(rdb *redis.Client, l tierlimit.Limit) (fixture, error) {
	return buildHybridWith(rdb, l, hybrid.WithPrefix("bench:"))
}

// buildHybridWith builds hybrid with opts.
func buildHybridWith(rdb *redis.Client, l tierlimit.Limit, opts ...hybrid.Option) (fixture, error) {
	lim, err := hybrid.New(rdb, l, opts...)
	if err != nil {
		return fixture{}, err
	}
	return fixture{func(ctx context.Context, key string) (bool, int64, error) {
		r, err := lim.Allow(ctx, key)
		return r.Allowed, r.Remaining, err
	}, lim.Close, func() int64 { return lim.Stats().Fallback }}, nil
}

// buildXrate is one x/time/rate limiter shared by every key: the cost of a
// decision with no key lookup at all.
func buildXrate(_ *redis.Client, l tierlimit.Limit) (fixture, error) {
	lim := rate.NewLimiter(xrateLimit(l), int(l.Capacity()))
	return fixture{func(context.Context, string) (bool, int64, error) {
		return lim.Allow(), unknownRemaining, nil
	}, func() error { return nil }, nil}, nil
}

// buildSyncMapXrate is the usual hand-rolled keyed limiter: a sync.Map of
// x/time/rate limiters created on first use, never evicted.
func buildSyncMapXrate(_ *redis.Client, l tierlimit.Limit) (fixture, error) {
	var m sync.Map
	every, burst := xrateLimit(l), int(l.Capacity())
	return fixture{func(_ context.Context, key string) (bool, int64, error) {
		v, ok := m.Load(key)
		if !ok {
			v, _ = m.LoadOrStore(key, rate.NewLimiter(every, burst))
		}
		return v.(*rate.Limiter).Allow(), unknownRemaining, nil
	}, func() error { return nil }, nil}, nil
}

// buildSethvargo is github.com/sethvargo/go-limiter's memorystore: Tokens
// per Interval, its bucket as large as Tokens.
func buildSethvargo(_ *redis.Client, l tierlimit.Limit) (fixture, error) {
	if l.Capacity() != l.Rate {
		return fixture{}, fmt.Errorf("sethvargo %v: %w", l, errNoBurst)
	}
	st, err := memorystore.New(&memorystore.Config{Tokens: uint64(l.Rate), Interval: l.Period})
	if err != nil {
		return fixture{}, err
	}
	return fixture{func(ctx context.Context, key string) (bool, int64, error) {
		_, remaining, _, ok, err := st.Take(ctx, key)
		return ok, int64(remaining), err
	}, func() error { return st.Close(context.Background()) }, nil}, nil
}

// ululeRate is l as github.com/ulule/limiter's fixed window: Limit events
// per Period.
func ululeRate(l tierlimit.Limit) (ulule.Rate, error) {
	if l.Capacity() != l.Rate {
		return ulule.Rate{}, fmt.Errorf("ulule %v: %w", l, errNoBurst)
	}
	return ulule.Rate{Period: l.Period, Limit: l.Rate}, nil
}

// ululeAllow adapts a ulule limiter: Get counts the event and says whether
// the window's limit was reached.
func ululeAllow(lim *ulule.Limiter) allowFunc {
	return func(ctx context.Context, key string) (bool, int64, error) {
		c, err := lim.Get(ctx, key)
		return !c.Reached, c.Remaining, err
	}
}

func buildUluleMemory(_ *redis.Client, l tierlimit.Limit) (fixture, error) {
	r, err := ululeRate(l)
	if err != nil {
		return fixture{}, err
	}
	lim := ulule.New(ulmemory.NewStore(), r)
	return fixture{ululeAllow(lim), func() error { return nil }, nil}, nil
}

func buildUluleRedis(rdb *redis.Client, l tierlimit.Limit) (fixture, error) {
	r, err := ululeRate(l)
	if err != nil {
		return fixture{}, err
	}
	st, err := ulredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "ulule", MaxRetry: ulule.DefaultMaxRetry})
	if err != nil {
		return fixture{}, err
	}
	return fixture{ululeAllow(ulule.New(st, r)), func() error { return nil }, nil}, nil
}

// buildThrottledRedis is github.com/throttled/throttled's GCRA on its
// go-redis v9 store. Its MaxBurst counts the requests allowed beyond the
// first, so our Capacity is MaxBurst+1.
func buildThrottledRedis(rdb *redis.Client, l tierlimit.Limit) (fixture, error) {
	st, err := goredisstore.NewCtx(rdb, "throttled:")
	if err != nil {
		return fixture{}, err
	}
	lim, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(int(l.Rate), l.Period),
		MaxBurst: int(l.Capacity() - 1),
	})
	if err != nil {
		return fixture{}, err
	}
	return fixture{func(ctx context.Context, key string) (bool, int64, error) {
		limited, res, err := lim.RateLimitCtx(ctx, key, 1)
		return !limited, int64(res.Remaining), err
	}, func() error { return nil }, nil}, nil
}
