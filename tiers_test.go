package tierlimit_test

// The one table of tiers the root tests run: every test that runs over
// tiers ranges over tiers, keeping those whose flags it needs.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// limiter is what every tier offers: the remote limiters get a Close that
// does nothing (they hold nothing to release).
type limiter interface {
	tenanttest.Tenant
	Reset(ctx context.Context, key string) error
	Close() error
}

// tierOptions are the settings a test may give a tier's constructor; the
// zero value is every tier's defaults.
type tierOptions struct {
	limitFunc tierlimit.LimitFunc // every tier: WithLimitFunc
	// limitLookup, lookupFailOpen: every tier's WithLimitLookup and
	// WithLookupFailOpen.
	limitLookup    tierlimit.LimitLookup
	lookupFailOpen bool
	observer       *tierlimit.Observer // every tier: WithObserver
	// clock: local's WithClock, remote's WithClientClock. hybrid ignores
	// it: its leases come from a bucket on Redis's clock (see clocked).
	clock    *clocktest.Clock
	prefix   string        // remote and hybrid: WithPrefix
	maxKeys  int64         // local only: WithMaxKeys
	leaseTTL time.Duration // hybrid only: WithLeaseTTL
}

// tier is one limiter under the root tests.
type tier struct {
	// name is the subtest's name; a tier's keys in a shared Redis are
	// often prefixed with it.
	name string
	// new makes the tier's limiter on rdb (local ignores it). On an error
	// the limiter is nil, not a typed nil.
	new func(rdb redis.UniversalClient, l tierlimit.Limit, o tierOptions) (limiter, error)
	// redis: the tier keeps its state in Redis, so instances on one
	// Redis share it, and it reads the server's eviction settings at New.
	redis bool
	// window: the algorithm counts Rate per Period (a denied call waits up
	// to a Period, and the sliding window counter, which weighs the last
	// window's count, a token's time more); otherwise it is a token bucket
	// that refills a token every Period/Rate.
	window bool
	// clocked: tierOptions.clock decides the tier's time.
	clocked bool
	// closable: Close releases something, and the limiter's calls after it
	// are tierlimit.ErrClosed.
	closable bool
}

// tiers is every tier: local, each remote algorithm and hybrid.
var tiers = []tier{
	{name: "local", new: newLocal, clocked: true, closable: true},
	remoteTier("remote token bucket", false, remote.NewTokenBucket),
	remoteTier("remote gcra", false, remote.NewGCRA),
	remoteTier("remote fixed window", true, remote.NewFixedWindow),
	remoteTier("remote anchored window", true, remote.NewAnchoredWindow),
	remoteTier("remote sliding log", true, remote.NewSlidingLog),
	remoteTier("remote sliding window", true, remote.NewSlidingWindow),
	{name: "hybrid", new: newHybrid, redis: true, closable: true},
}

// tierNamed returns the tier of tiers called name.
func tierNamed(name string) (tier, bool) {
	for _, tr := range tiers {
		if tr.name == name {
			return tr, true
		}
	}
	return tier{}, false
}

// open makes the tier's limiter, failing the test on an error, and closes
// it when the test ends.
func (tr tier) open(t *testing.T, rdb redis.UniversalClient, l tierlimit.Limit, o tierOptions) limiter {
	t.Helper()
	lim, err := tr.new(rdb, l, o)
	if err != nil {
		t.Fatalf("%s: new(%v) = %v", tr.name, l, err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// options returns the options of each package that o's settings map to.
func (o tierOptions) options() (lo []local.Option, re []remote.Option, hy []hybrid.Option) {
	if o.limitFunc != nil {
		lo = append(lo, local.WithLimitFunc(o.limitFunc))
		re = append(re, remote.WithLimitFunc(o.limitFunc))
		hy = append(hy, hybrid.WithLimitFunc(o.limitFunc))
	}
	if o.limitLookup != nil {
		lo = append(lo, local.WithLimitLookup(o.limitLookup))
		re = append(re, remote.WithLimitLookup(o.limitLookup))
		hy = append(hy, hybrid.WithLimitLookup(o.limitLookup))
	}
	if o.lookupFailOpen {
		lo = append(lo, local.WithLookupFailOpen())
		re = append(re, remote.WithLookupFailOpen())
		hy = append(hy, hybrid.WithLookupFailOpen())
	}
	if o.observer != nil {
		lo = append(lo, local.WithObserver(o.observer))
		re = append(re, remote.WithObserver(o.observer))
		hy = append(hy, hybrid.WithObserver(o.observer))
	}
	if o.clock != nil {
		lo = append(lo, local.WithClock(o.clock))
		re = append(re, remote.WithClientClock(o.clock))
	}
	if o.prefix != "" {
		re = append(re, remote.WithPrefix(o.prefix))
		hy = append(hy, hybrid.WithPrefix(o.prefix))
	}
	if o.maxKeys != 0 {
		lo = append(lo, local.WithMaxKeys(o.maxKeys))
	}
	if o.leaseTTL != 0 {
		hy = append(hy, hybrid.WithLeaseTTL(o.leaseTTL))
	}
	return lo, re, hy
}

func newLocal(_ redis.UniversalClient, l tierlimit.Limit, o tierOptions) (limiter, error) {
	opts, _, _ := o.options()
	return nilIfErr(local.New(l, opts...))
}

func newHybrid(rdb redis.UniversalClient, l tierlimit.Limit, o tierOptions) (limiter, error) {
	_, _, opts := o.options()
	return nilIfErr(hybrid.New(rdb, l, opts...))
}

// remoteLimiter is what every remote limiter offers.
type remoteLimiter interface {
	tenanttest.Tenant
	Reset(ctx context.Context, key string) error
	Eviction() tierlimit.EvictionRisk
}

// unclosable gives a remote limiter the limiter interface; its Close does
// nothing.
type unclosable struct{ remoteLimiter }

func (unclosable) Close() error { return nil }

func remoteTier[R remoteLimiter](name string, window bool, mk func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (R, error)) tier {
	return tier{name: name, redis: true, window: window, clocked: true,
		new: func(rdb redis.UniversalClient, l tierlimit.Limit, o tierOptions) (limiter, error) {
			_, opts, _ := o.options()
			r, err := mk(rdb, l, opts...)
			if err != nil {
				return nil, err
			}
			return unclosable{r}, nil
		}}
}

func nilIfErr[T limiter](l T, err error) (limiter, error) {
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return l, nil
}

// evictionOf returns what a Redis tier's limiter read of the server's
// eviction settings at New (Eviction, hybrid's Stats.Eviction).
func evictionOf(l limiter) tierlimit.EvictionRisk {
	switch l := l.(type) {
	case *hybrid.Limiter:
		return l.Stats().Eviction
	case unclosable:
		return l.Eviction()
	}
	panic("evictionOf: not a limiter of a Redis tier")
}
