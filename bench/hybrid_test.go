package bench

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
	"golang.org/x/time/rate"
)

// plenty never runs out during a benchmark: every call is allowed, so the
// hot path is what is measured.
var plenty = tierlimit.Limit{Rate: 1_000_000, Period: 1e9, Burst: 1 << 40}

// regimes are the limits of the hybrid benchmarks: nothing denied, at a
// limit with plenty of burst and at PerSecond(10^9) (bandwidth in bytes: a
// gigabyte a second), and a hot key far over its limit (almost everything
// denied).
var regimes = []struct {
	name  string
	limit tierlimit.Limit
}{
	{"allowed", plenty},
	{"allowed_1e9", tierlimit.PerSecond(1_000_000_000)},
	{"saturated", tierlimit.PerSecond(1000)},
}

// localPeer is a limiter that decides in process, built per benchmark.
type localPeer struct {
	name  string
	build func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc
}

// hotPeers: hybrid, x/time/rate (one limiter, the in-process ideal), and
// redis_rate (one round trip per decision).
var hotPeers = []localPeer{
	{"hybrid", func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc { return buildHybrid(b, rdb, l) }},
	// hybrid_limitfunc: the key's limit comes from a LimitFunc, and is not
	// the limiter's default (issue 15's bar: within 5% of hybrid).
	{"hybrid_limitfunc", func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc {
		return buildHybrid(b, rdb, tierlimit.PerSecond(1), hybrid.WithLimitFunc(func(string) tierlimit.Limit { return l }))
	}},
	{"xrate", func(_ *testing.B, _ *redis.Client, l tierlimit.Limit) allowFunc {
		lim := rate.NewLimiter(xrateLimit(l), int(l.Capacity()))
		return func(context.Context, string) (bool, int64, error) { return lim.Allow(), 0, nil }
	}},
	{"redis_rate", func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc {
		f, _ := redisRate(rdb, l)
		return f
	}},
}

// zipfPeers: hybrid and the usual local baseline, a sync.Map of
// x/time/rate limiters created on first use.
var zipfPeers = []localPeer{
	{"hybrid", func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc { return buildHybrid(b, rdb, l) }},
	{"hybrid_ttl10s", func(b *testing.B, rdb *redis.Client, l tierlimit.Limit) allowFunc {
		return buildHybrid(b, rdb, l, hybrid.WithLeaseTTL(10*time.Second))
	}},
	{"syncmap_xrate", func(_ *testing.B, _ *redis.Client, l tierlimit.Limit) allowFunc {
		var m sync.Map
		every, burst := xrateLimit(l), int(l.Capacity())
		return func(_ context.Context, key string) (bool, int64, error) {
			v, ok := m.Load(key)
			if !ok {
				v, _ = m.LoadOrStore(key, rate.NewLimiter(every, burst))
			}
			return v.(*rate.Limiter).Allow(), 0, nil
		}
	}},
}

func buildHybrid(b *testing.B, rdb *redis.Client, l tierlimit.Limit, opts ...hybrid.Option) allowFunc {
	lim, err := hybrid.New(rdb, l, append([]hybrid.Option{hybrid.WithPrefix("bench:")}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lim.Close() })
	return func(ctx context.Context, key string) (bool, int64, error) {
		r, err := lim.Allow(ctx, key)
		return r.Allowed, r.Remaining, err
	}
}

func xrateLimit(l tierlimit.Limit) rate.Limit {
	return rate.Limit(float64(l.Rate) / l.Period.Seconds())
}

// BenchmarkHotKey is one hot key, serial: hybrid against x/time/rate and
// redis_rate, with Redis calls per 1000 decisions counted by Redis.
func BenchmarkHotKey(b *testing.B) { benchHot(b, false) }

// BenchmarkHotKeyParallel is BenchmarkHotKey from GOMAXPROCS goroutines.
func BenchmarkHotKeyParallel(b *testing.B) { benchHot(b, true) }

func benchHot(b *testing.B, parallel bool) {
	srv := redistest.Start(b)
	for _, rg := range regimes {
		for _, p := range hotPeers {
			b.Run(rg.name+"/"+p.name, func(b *testing.B) {
				rdb := srv.Client(b)
				allow := p.build(b, rdb, rg.limit)
				run(b, rdb, allow, parallel, 10_000, func(int) string { return hotKey })
			})
		}
	}
}

// BenchmarkZipf10k draws keys from 10,000 with a Zipf (s = 1.1) skew:
// hybrid against a sync.Map of x/time/rate limiters.
func BenchmarkZipf10k(b *testing.B) {
	keys := zipfKeys(10_000, 1<<16)
	srv := redistest.Start(b)
	for _, parallel := range []bool{false, true} {
		mode := "serial"
		if parallel {
			mode = "parallel"
		}
		for _, p := range zipfPeers {
			b.Run(mode+"/"+p.name, func(b *testing.B) {
				rdb := srv.Client(b)
				allow := p.build(b, rdb, plenty)
				// 20 passes over the key sequence.
				run(b, rdb, allow, parallel, 20*len(keys), func(i int) string { return keys[i&(len(keys)-1)] })
			})
		}
	}
}

// run times allow, serially or in parallel, and reports Redis script calls
// per 1000 decisions. Each limiter is first brought to its steady state by
// warm calls (scripts loaded, every key's lease grown to its demand), as in
// a service that has been running for a while.
func run(b *testing.B, rdb *redis.Client, allow allowFunc, parallel bool, warm int, key func(int) string) {
	ctx := context.Background()
	for i := 0; i < warm; i++ {
		if _, _, err := allow(ctx, key(i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		var seed uint64
		var mu sync.Mutex
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			seed++
			i := int(seed * 7919)
			mu.Unlock()
			for pb.Next() {
				i++
				if _, _, err := allow(ctx, key(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	} else {
		for i := 0; i < b.N; i++ {
			if _, _, err := allow(ctx, key(i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	st, err := readScriptStats(ctx, rdb)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(1000*float64(st.scripts)/float64(b.N), "redis-calls/1k")
}

// zipfKeys returns n keys drawn from space keys with a Zipf skew (s = 1.1).
func zipfKeys(space uint64, n int) []string {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, space-1)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.FormatUint(z.Uint64(), 10)
	}
	return keys
}

// BenchmarkClaimServerCost measures what one lease claim costs Redis, the
// cost that bounds hybrid on many keys when the server shares the
// machine: each iteration is one pipelined batch of 256 claims of 100
// tokens (the largest lease of compareLimit), one per key, as hybrid's
// background refills send them, and server-ns/claim is the time Redis
// spent running the batches (INFO commandstats) per claim. hybrid spends
// about a claim per lease of tokens, so a key's decisions cost Redis this
// divided by its lease size each.
func BenchmarkClaimServerCost(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	st, err := store.New(rdb, store.TokenBucket, compareLimit, store.Config{Prefix: "bench:", Hold: 3 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	const batch = 256
	keys := make([]string, batch)
	received := make([]int64, batch)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	gen := int64(0)
	claim := func() {
		gen++
		claims := make([]store.Claim, batch)
		for i := range claims {
			claims[i] = store.Claim{Min: 1, Want: 100, Holder: "h" + keys[i], Gen: gen, Received: received[i], Live: gen > 1}
		}
		for i, g := range st.LeaseBatch(ctx, keys, claims) {
			if g.Err != nil {
				b.Fatal(g.Err)
			}
			received[i] += g.Granted
		}
	}
	claim() // the script loaded, the keys made
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatalf("CONFIG RESETSTAT: %v", err)
	}
	n := 0
	for b.Loop() {
		claim()
		n++
	}
	s, err := readScriptStats(ctx, rdb)
	if err != nil {
		b.Fatalf("INFO commandstats: %v", err)
	}
	if s.scripts < int64(n) {
		b.Fatalf("Redis counted %d script calls, want at least %d", s.scripts, n)
	}
	b.ReportMetric(float64(s.usec)*1e3/float64(n*batch), "server-ns/claim")
	b.ReportMetric(float64(b.Elapsed())/float64(n*batch), "ns/claim")
}

// BenchmarkZipfCallerClaims counts what BenchmarkCompare's Zipf scenario
// makes hybrid's callers wait for: the decisions that claimed on the
// caller's goroutine (Stats().Remote) per million, serially, on
// compareLimit, whose hottest keys are saturated. A blocked key's next
// claim goes out in the background shortly before its block ends
// (docs/design.md §3, "Blocking"); a key whose denials miss that window
// has its first caller after the block claim and wait.
func BenchmarkZipfCallerClaims(b *testing.B) {
	srv := redistest.Start(b)
	lim, err := hybrid.New(srv.Client(b), compareLimit, hybrid.WithPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	keys := zipfKeys(10_000, 1<<16)
	ctx := context.Background()
	for i := range 20 * len(keys) {
		if _, err := lim.Allow(ctx, keys[i&(len(keys)-1)]); err != nil {
			b.Fatal(err)
		}
	}
	before := lim.Stats().Remote
	i := 0
	for b.Loop() {
		if _, err := lim.Allow(ctx, keys[i&(len(keys)-1)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(1e6*float64(lim.Stats().Remote-before)/float64(i), "caller-claims/1M")
}

// BenchmarkLeaseBound is BenchmarkCompare's 10k-key scenarios for hybrid at
// its default lease bound (hi = Burst/10, 100 tokens of compareLimit) and
// at three times that, WithLeaseBounds(1, 300): every allowed token is
// claimed from Redis, so a claim's cost, spread over its lease, is part of
// each decision (redis-cpu-ns/op), and Redis shares the benchmark's cores.
// What a larger bound costs is in docs/design.md, G2 and G4: each instance
// may hold up to 3·hi/2 tokens of a key.
func BenchmarkLeaseBound(b *testing.B) {
	runCompare(b, func(sc scenario) []entrant {
		if sc.name == "hot" {
			return nil
		}
		var es []entrant
		for _, hi := range []int64{0, 300} {
			name, opts := "hi=default", []hybrid.Option{hybrid.WithPrefix("bench:")}
			if hi > 0 {
				name, opts = "hi="+strconv.FormatInt(hi, 10), append(opts, hybrid.WithLeaseBounds(1, hi))
			}
			es = append(es, entrant{name, contender{name: "hybrid", where: leased, perKey: true,
				build: func(rdb *redis.Client, l tierlimit.Limit) (fixture, error) {
					return buildHybridWith(rdb, l, opts...)
				}}})
		}
		return es
	})
}
