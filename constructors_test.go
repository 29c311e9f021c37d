package tierlimit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/canary"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/remote"
)

// redisConstructor is one constructor of a limiter in Redis, of any tier
// and kind, reduced to what every one takes: a client, a prefix and a size
// (a rate per second, or permits per key).
type redisConstructor struct {
	name string
	// family: constructors of one family keep their state in the same keys
	// on one prefix (remote's token bucket and hybrid's leases share the
	// bucket; both tiers' permits share the semaphore).
	family string
	new    func(rdb redis.UniversalClient, prefix string, size int64) (closer, error)
}

type closer interface{ Close() error }

// noClose is a remote rate limiter, which holds nothing to release.
type noClose struct{ any }

func (noClose) Close() error { return nil }

func rateConstructor[L any](name, family string, mk func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (L, error)) redisConstructor {
	return redisConstructor{name, family, func(rdb redis.UniversalClient, prefix string, size int64) (closer, error) {
		l, err := mk(rdb, tierlimit.PerSecond(size), remote.WithPrefix(prefix))
		if err != nil {
			return nil, err
		}
		return noClose{l}, nil
	}}
}

// redisConstructors is every constructor of a limiter in Redis.
var redisConstructors = []redisConstructor{
	rateConstructor("remote.NewTokenBucket", "tb", remote.NewTokenBucket),
	rateConstructor("remote.NewGCRA", "gcra", remote.NewGCRA),
	rateConstructor("remote.NewFixedWindow", "fw", remote.NewFixedWindow),
	rateConstructor("remote.NewAnchoredWindow", "aw", remote.NewAnchoredWindow),
	rateConstructor("remote.NewSlidingLog", "sl", remote.NewSlidingLog),
	rateConstructor("remote.NewSlidingWindow", "sw", remote.NewSlidingWindow),
	{"hybrid.New", "tb", func(rdb redis.UniversalClient, prefix string, size int64) (closer, error) {
		l, err := hybrid.New(rdb, tierlimit.PerSecond(size), hybrid.WithPrefix(prefix))
		if err != nil {
			return nil, err
		}
		return l, nil
	}},
	{"remote.NewConcurrency", "permits", func(rdb redis.UniversalClient, prefix string, size int64) (closer, error) {
		c, err := remote.NewConcurrency(rdb, size, remote.WithPermitPrefix(prefix))
		if err != nil {
			return nil, err
		}
		return c, nil
	}},
	{"hybrid.NewConcurrency", "permits", func(rdb redis.UniversalClient, prefix string, size int64) (closer, error) {
		c, err := hybrid.NewConcurrency(rdb, size, hybrid.WithPermitPrefix(prefix))
		if err != nil {
			return nil, err
		}
		return c, nil
	}},
}

// TestConstructorsRefuseNilClients: every constructor refuses a nil
// client, the nil interface or a typed nil of either kind, with an error
// wrapping ErrInvalidOption, instead of a limiter that crashes the
// process at its first call.
func TestConstructorsRefuseNilClients(t *testing.T) {
	clients := []struct {
		name string
		rdb  redis.UniversalClient
	}{
		{"nil", nil},
		{"typed nil *redis.Client", (*redis.Client)(nil)},
		{"typed nil *redis.ClusterClient", (*redis.ClusterClient)(nil)},
	}
	for _, c := range redisConstructors {
		for _, rdb := range clients {
			t.Run(c.name+"/"+rdb.name, func(t *testing.T) {
				l, err := c.new(rdb.rdb, "nil:", 10)
				if l != nil {
					l.Close()
				}
				if !errors.Is(err, tierlimit.ErrInvalidOption) {
					t.Errorf("%s(%s) = %v, want an error wrapping ErrInvalidOption", c.name, rdb.name, err)
				}
			})
		}
	}
}

// TestConstructorsRefuseWrongTopology: every constructor refuses, with an
// error wrapping ErrMisconfigured, a plain client on a node of a 3-master
// Redis Cluster (every key on another node would get MOVED) and a Cluster
// client on a standalone server, instead of a limiter that grants some
// keys and refuses others without an error.
func TestConstructorsRefuseWrongTopology(t *testing.T) {
	cluster := redistest.StartCluster(t)
	single := redistest.Start(t)
	setups := []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"plain client on a cluster node", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: cluster.Addrs[1]})
		}},
		{"cluster client on a standalone server", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{single.Addr}})
		}},
	}
	for _, s := range setups {
		for _, c := range redisConstructors {
			t.Run(s.name+"/"+c.name, func(t *testing.T) {
				rdb := s.rdb()
				defer rdb.Close()
				l, err := c.new(rdb, "topology:", 10)
				if l != nil {
					l.Close()
				}
				if !errors.Is(err, tierlimit.ErrMisconfigured) {
					t.Errorf("%s = %v, want an error wrapping ErrMisconfigured", c.name, err)
				}
			})
		}
	}
}

// TestConstructorsRefuseSharedPrefix: two live limiters of one process
// whose keys would be the same (one family on one prefix and server) but
// whose limits differ are refused, the second with an error wrapping
// ErrMisconfigured that names both constructors, across tiers too: each
// would rewrite the other's state under its own limit. The same limit
// shares on purpose; another prefix is fine, and so is a limiter made
// after the first was closed, or dropped (remote's rate limiters have no
// Close).
func TestConstructorsRefuseSharedPrefix(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	for i, a := range redisConstructors {
		for j, b := range redisConstructors {
			if a.family != b.family {
				continue
			}
			t.Run(a.name+"/"+b.name, func(t *testing.T) {
				prefix := fmt.Sprintf("shared%d-%d:", i, j)
				first, err := a.new(rdb, prefix, 10)
				if err != nil {
					t.Fatalf("%s = %v", a.name, err)
				}
				second, err := b.new(rdb, prefix, 100)
				if !errors.Is(err, tierlimit.ErrMisconfigured) {
					t.Errorf("%s of 10, then %s of 100 on one prefix = %v, want an error wrapping ErrMisconfigured", a.name, b.name, err)
				} else {
					for _, name := range []string{a.name, b.name, prefix} {
						if !strings.Contains(err.Error(), name) {
							t.Errorf("the error %q does not name %s", err, name)
						}
					}
				}
				if second != nil {
					second.Close()
				}
				for _, c := range []struct {
					what   string
					prefix string
					size   int64
				}{
					{"the same size on the same prefix", prefix, 10},
					{"another size on another prefix", prefix + "other:", 100},
				} {
					l, err := b.new(rdb, c.prefix, c.size)
					if err != nil {
						t.Errorf("%s of 10, then %s of %s = %v, want nil", a.name, b.name, c.what, err)
						continue
					}
					l.Close()
				}
				runtime.KeepAlive(first)
				first.Close()
				if _, dropped := first.(noClose); !dropped {
					l, err := b.new(rdb, prefix, 100)
					if err != nil {
						t.Errorf("%s of 100 after the %s of 10 was closed = %v, want nil", b.name, a.name, err)
					} else {
						l.Close()
					}
					return
				}
				first = nil
				l, err := b.new(rdb, prefix, 100)
				if err != nil {
					t.Errorf("%s of 100 after the %s of 10 was dropped = %v, want nil", b.name, a.name, err)
				} else {
					l.Close()
				}
			})
		}
	}
}

// newBound is what every constructor waits for a stalled Redis at most
// (docs: about half a second), besides the scheduling delay the test
// measures.
const newBound = 600 * time.Millisecond

// stalls are the stalls of a Redis that keeps its state, as each
// constructor meets them: every command held back for d (CLIENT PAUSE
// ALL), or the process stopped (SIGSTOP) until end.
var stalls = []struct {
	name  string
	begin func(t *testing.T, s *redistest.Server, d time.Duration) (end func())
}{
	{"client pause all", func(t *testing.T, s *redistest.Server, d time.Duration) func() {
		admin := s.Client(t)
		if err := admin.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		return func() { // the pause ends by itself: wait for it
			for admin.Ping(context.Background()).Err() != nil {
			}
		}
	}},
	{"sigstop", func(t *testing.T, s *redistest.Server, _ time.Duration) func() {
		s.Pause()
		return s.Resume
	}},
}

// settled waits up to within for the process's goroutines to be no more
// than base, and returns how many there are.
func settled(base int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

// TestConstructorsOnStalledRedis: with go-redis's default client (which
// ignores context deadlines, ReadTimeout 3 s), every constructor returns a
// limiter within newBound while Redis is stalled, by CLIENT PAUSE ALL or
// SIGSTOP, and the goroutines that waited for Redis end once the stall
// ends.
func TestConstructorsOnStalledRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis")
	}
	for _, f := range stalls {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := defaultClient(t, s)
			if err := rdb.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			c := canary.Start()
			defer c.Stop()
			base := runtime.NumGoroutine()
			for i, ctor := range redisConstructors {
				end := f.begin(t, s, 2*newBound)
				c.Reset()
				start := time.Now()
				l, err := ctor.new(rdb, fmt.Sprintf("stalled%d:", i), 10)
				took := time.Since(start)
				late := c.Worst()
				end()
				if err != nil {
					t.Errorf("%s on a stalled Redis = %v, want a limiter", ctor.name, err)
				} else {
					l.Close()
				}
				if took > newBound+late {
					t.Errorf("%s on a stalled Redis took %v, want at most %v + %v (this process's scheduling delay)", ctor.name, took, newBound, late)
				} else {
					t.Logf("%s took %v (scheduling delay %v)", ctor.name, took, late)
				}
			}
			// The client gives a stalled call up after its ReadTimeout (3 s)
			// and its retries.
			if n := settled(base, 10*time.Second); n > base {
				t.Errorf("%d goroutines 10 s after the stalls, want at most %d as before them", n, base)
			}
		})
	}
}

// TestEmptyPrefixIsTheDefault: WithPrefix("") keeps a rate limiter's keys
// under DefaultPrefix, so a limiter of another limit there is refused.
func TestEmptyPrefixIsTheDefault(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	first, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(10), remote.WithPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		new  func() (closer, error)
	}{
		{"remote.NewTokenBucket", func() (closer, error) {
			l, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(100))
			return noClose{l}, err
		}},
		{"hybrid.New", func() (closer, error) { return hybrid.New(rdb, tierlimit.PerSecond(100)) }},
		{"hybrid.New with WithPrefix(\"\")", func() (closer, error) {
			return hybrid.New(rdb, tierlimit.PerSecond(100), hybrid.WithPrefix(""))
		}},
	} {
		l, err := c.new()
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, tierlimit.ErrMisconfigured) {
			t.Errorf("%s of 100/s beside a token bucket of 10/s under WithPrefix(\"\") = %v, want an error wrapping ErrMisconfigured", c.name, err)
		}
	}
	runtime.KeepAlive(first)
}
