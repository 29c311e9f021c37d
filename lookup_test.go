package tierlimit_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/tenanttest"
)

// TestLimitLookup: on every tier, on a real redis-server, a LimitLookup
// that fails fails closed by default (tenanttest.CheckLookupFails: every
// call an error wrapping ErrLimitLookup and the lookup's, no key charged)
// and decides under the default with WithLookupFailOpen.
func TestLimitLookup(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { rdb.Close() })
	def := tierlimit.PerSecond(5)
	for _, tier := range tiers {
		t.Run(tier.name+"/fail closed", func(t *testing.T) {
			var lk tenanttest.Lookup
			l := tier.open(t, rdb, def, tierOptions{limitLookup: lk.Limit, prefix: "lookup-closed:"})
			tenanttest.CheckLookupFails(t, l, &lk, "down:"+tier.name, "up:"+tier.name)
		})
		t.Run(tier.name+"/fail open", func(t *testing.T) {
			var lk tenanttest.Lookup
			l := tier.open(t, rdb, def, tierOptions{limitLookup: lk.Limit, lookupFailOpen: true, prefix: "lookup-open:"})
			tenanttest.CheckLookupFailsOpen(t, l, &lk, "down:"+tier.name, def)
		})
	}
}

// TestLimitLookupOptions: every tier refuses WithLimitFunc with
// WithLimitLookup, and WithLookupFailOpen without a lookup.
func TestLimitLookupOptions(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { rdb.Close() })
	var lk tenanttest.Lookup
	for _, tier := range tiers {
		for name, o := range map[string]tierOptions{
			"both functions":       {limitFunc: tenanttest.Plans, limitLookup: lk.Limit},
			"fail open, no lookup": {lookupFailOpen: true},
		} {
			if l, err := tier.new(rdb, tierlimit.PerSecond(5), o); !errors.Is(err, tierlimit.ErrInvalidOption) {
				if l != nil {
					l.Close()
				}
				t.Errorf("%s: new with %s: error %v, want ErrInvalidOption", tier.name, name, err)
			}
		}
	}
}
