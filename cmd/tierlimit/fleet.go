package main

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// The strategies the demo and bench compare.
const (
	stratLocal  = "local"       // a token bucket per key in each instance, no Redis
	stratTB     = "remote-tb"   // remote.TokenBucket: one Lua call per decision
	stratGCRA   = "remote-gcra" // remote.GCRA: one Lua call per decision
	stratHybrid = "hybrid"      // leases from the Redis token bucket, local fallback
)

var allStrategies = []string{stratLocal, stratTB, stratGCRA, stratHybrid}

// Hybrid settings of the demo and bench: a budget per Redis call as long
// as the clients' read timeout (the default, 25 ms, suits a Redis in its
// own process; see ioTimeout for an embedded one), leases refunded after
// 500 ms (default 1 s), so that short runs return their unspent tokens,
// and a breaker that probes a dead Redis every 250 ms.
const (
	hybridCallBudget    = ioTimeout
	hybridLeaseTTL      = 500 * time.Millisecond
	hybridProbeInterval = 250 * time.Millisecond // default 500 ms: a short demo shows the recovery sooner
)

// parseStrategies parses a comma-separated -strategies flag.
func parseStrategies(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		known := false
		for _, k := range allStrategies {
			known = known || name == k
		}
		if !known {
			return nil, usagef("-strategies: unknown strategy %q (want some of %s)", name, strings.Join(allStrategies, ","))
		}
		for _, o := range out {
			if o == name {
				return nil, usagef("-strategies: %q given twice", name)
			}
		}
		out = append(out, name)
	}
	return out, nil
}

// fleet is one strategy's limiters: several instances, each with its own
// Redis client, as separate processes would have.
type fleet struct {
	strategy string
	limit    tierlimit.Limit
	members  []tierlimit.Limiter
	hybrids  []*hybrid.Limiter // the members, when the strategy is hybrid
	closers  []func() error
	calls    callcount.Hook // script calls of every member's client

	// mu guards breakers: per hybrid member, its circuit breaker's
	// transitions as they were reported.
	mu       sync.Mutex
	breakers [][]breakerEvent
}

// breakerEvent is a transition of a hybrid member's circuit breaker.
type breakerEvent struct {
	at time.Time
	to tierlimit.BreakerState
}

// newFleet builds n instances of strategy enforcing limit. Each client has
// pool connections. Hybrid instances fall back, while Redis is down, to
// their share of the limit.
func newFleet(srv *server, strategy string, limit tierlimit.Limit, n, pool int) (*fleet, error) {
	f := &fleet{strategy: strategy, limit: limit}
	for range n {
		if err := f.add(srv, n, pool); err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

func (f *fleet) add(srv *server, n, pool int) error {
	if f.strategy == stratLocal {
		l, err := local.New(f.limit)
		if err != nil {
			return err
		}
		f.members, f.closers = append(f.members, l), append(f.closers, l.Close)
		return nil
	}
	rdb := srv.client(pool, &f.calls)
	f.closers = append(f.closers, rdb.Close)
	var lim tierlimit.Limiter
	var err error
	switch f.strategy {
	case stratTB:
		lim, err = remote.NewTokenBucket(rdb, f.limit)
	case stratGCRA:
		lim, err = remote.NewGCRA(rdb, f.limit)
	case stratHybrid:
		var h *hybrid.Limiter
		obs := &tierlimit.Observer{Breaker: f.observeBreaker(len(f.hybrids))}
		h, err = hybrid.New(rdb, f.limit, append(hybridOptions(f.limit, n), hybrid.WithObserver(obs))...)
		if err == nil {
			lim = h
			f.hybrids = append(f.hybrids, h)
			// Close the limiter before its client: it refunds through it.
			f.closers = append(f.closers[:len(f.closers)-1], h.Close, rdb.Close)
		}
	default:
		err = fmt.Errorf("unknown strategy %q", f.strategy)
	}
	if err != nil {
		return err
	}
	f.members = append(f.members, lim)
	return nil
}

// hybridOptions are the options of one of n hybrid instances: while Redis
// is unreachable, each decides locally at its share of the limit.
func hybridOptions(limit tierlimit.Limit, n int) []hybrid.Option {
	return []hybrid.Option{
		hybrid.WithCallBudget(hybridCallBudget),
		hybrid.WithLeaseTTL(hybridLeaseTTL),
		hybrid.WithFailureMode(hybrid.FailFallback),
		hybrid.WithFallback(share(limit, n)),
		hybrid.WithProbeInterval(hybridProbeInterval),
	}
}

// observeBreaker returns the breaker observer of hybrid member i.
func (f *fleet) observeBreaker(i int) func(tierlimit.BreakerChange) {
	f.mu.Lock()
	f.breakers = append(f.breakers, nil)
	f.mu.Unlock()
	return func(c tierlimit.BreakerChange) {
		f.mu.Lock()
		f.breakers[i] = append(f.breakers[i], breakerEvent{time.Now(), c.To})
		f.mu.Unlock()
	}
}

// breakerTimes returns, over the hybrid members, the longest each took to
// open its breaker after down (Redis killed) and to close it after up
// (Redis restarted). allOpened (allClosed) is true when every member's
// breaker opened (closed) in that time.
func (f *fleet) breakerTimes(down, up time.Time) (openedIn, closedIn time.Duration, allOpened, allClosed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	allOpened, allClosed = len(f.breakers) > 0, len(f.breakers) > 0
	for _, events := range f.breakers {
		var o, c time.Duration = -1, -1
		for _, e := range events {
			if e.to == tierlimit.BreakerOpen && o < 0 && !e.at.Before(down) && e.at.Before(up) {
				o = e.at.Sub(down)
			}
			if e.to == tierlimit.BreakerClosed && c < 0 && !e.at.Before(up) {
				c = e.at.Sub(up)
			}
		}
		allOpened, allClosed = allOpened && o >= 0, allClosed && c >= 0
		openedIn, closedIn = max(openedIn, o), max(closedIn, c)
	}
	return openedIn, closedIn, allOpened, allClosed
}

// share is one of n instances' part of limit, at least one event per period.
func share(limit tierlimit.Limit, n int) tierlimit.Limit {
	s := tierlimit.Limit{Rate: max(1, limit.Rate/int64(n)), Period: limit.Period}
	if limit.Burst != 0 {
		s.Burst = max(1, limit.Burst/int64(n))
	}
	return s
}

// hybridStats sums the hybrid members' counters.
func (f *fleet) hybridStats() hybrid.Stats {
	var sum hybrid.Stats
	for _, h := range f.hybrids {
		s := h.Stats()
		sum.Local += s.Local
		sum.Blocked += s.Blocked
		sum.Remote += s.Remote
		sum.Fallback += s.Fallback
		sum.RedisCalls += s.RedisCalls
		sum.RedisErrors += s.RedisErrors
		sum.BreakerOpens += s.BreakerOpens
	}
	return sum
}

// close closes every member and client, hybrid members first so that they
// refund their leases.
func (f *fleet) close() error {
	var errs []error
	for _, c := range f.closers {
		if err := c(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	f.closers = nil
	return errors.Join(errs...)
}
