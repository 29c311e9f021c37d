package bench

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// compareLimit is the one limit every contender of BenchmarkCompare
// enforces per key: 1000 per second, bucket 1000 (peers with a fixed window
// count 1000 per 1 s window). One hot key asks far more than that, so it is
// mostly denied; 10,000 keys ask less each, so they are mostly allowed, and
// a Zipf draw mixes both.
var compareLimit = tierlimit.PerSecond(1000)

// seqLen is the length of every scenario's key sequence; a power of two so
// that the position wraps with a mask.
const seqLen = 1 << 16

// A fixture is driven through its scenario before it is timed, as in a
// service that has been running for a while: scripts loaded, connections
// open, keys created, hybrid's leases grown to their demand. Every fixture
// is warmed for warmFor at least; those that decide in process also for
// warmPasses passes over the key sequence, unless that takes longer than
// warmMax (hybrid, whose claims of cold keys are round trips).
const (
	warmFor    = 200 * time.Millisecond
	warmPasses = 20
	warmMax    = 5 * time.Second
)

// scenario is a sequence of keys that callers ask for in turn.
type scenario struct {
	name string
	keys []string // seqLen keys, or one
}

func (s scenario) key(i int) string { return s.keys[i&(len(s.keys)-1)] }

// scenarios: one hot key, 10,000 keys drawn uniformly, and 10,000 keys drawn
// with a Zipf skew (s = 1.1, as in BenchmarkZipf10k).
var scenarios = sync.OnceValue(func() []scenario {
	r := rand.New(rand.NewPCG(3, 4))
	uniform := make([]string, seqLen)
	for i := range uniform {
		uniform[i] = "k" + strconv.Itoa(r.IntN(10_000))
	}
	return []scenario{
		{"hot", []string{hotKey}},
		{"uniform10k", uniform},
		{"zipf10k", zipfKeys(10_000, seqLen)},
	}
})

// BenchmarkCompare runs every contender (ours and the peers) in every
// scenario, serial and from GOMAXPROCS goroutines (RunParallel), all on one
// throwaway redis-server. Sub-benchmarks are named scenario/mode/contender,
// e.g. BenchmarkCompare/zipf10k/parallel/hybrid; go test runs each one
// -count times in a row, and those samples share one fixture, built and
// warmed before the first.
//
// Besides ns/op, B/op and allocs/op it reports, per decision, the round
// trips to Redis (redis-calls/op: one per command or pipeline sent, counted
// by a go-redis hook on the contender's own client, so hybrid's background
// refills count too), the commands those carried (redis-cmds/op), the
// fraction of decisions that were allowed (allowed/op) and, for contenders
// that use Redis, the CPU time redis-server spent per decision
// (redis-cpu-ns/op, from INFO cpu; 0 for the in-process ones), and the CPU
// time the benchmark's process spent per decision (cpu-ns/op, from
// getrusage: the caller's goroutines, background work, go-redis and the
// garbage collector), which is what a service on its own cores pays.
func BenchmarkCompare(b *testing.B) {
	runCompare(b, func(sc scenario) []entrant {
		var es []entrant
		for _, c := range contenders {
			if c.perKey || sc.name == "hot" {
				es = append(es, entrant{c.name, c})
			}
		}
		return es
	})
}

// entrant is a contender under the name its sub-benchmarks end with.
type entrant struct {
	name string
	c    contender
}

// runCompare runs, in every scenario and mode, each entrant that entrants
// returns for the scenario, as the sub-benchmark scenario/mode/name, all
// on one throwaway redis-server, one fixture at a time (BenchmarkCompare).
func runCompare(b *testing.B, entrants func(scenario) []entrant) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	var cur *compareFixture
	b.Cleanup(func() {
		if cur != nil {
			cur.release(b)
		}
	})
	for _, sc := range scenarios() {
		for _, parallel := range []bool{false, true} {
			mode := "serial"
			if parallel {
				mode = "parallel"
			}
			for _, e := range entrants(sc) {
				// The function runs once per sample, and under
				// RunParallel once per ramp-up step too; the fixture is
				// built and warmed once.
				var f *compareFixture
				b.Run(sc.name+"/"+mode+"/"+e.name, func(b *testing.B) {
					if f == nil {
						if cur != nil {
							cur.release(b)
						}
						f = newCompareFixture(b, srv, admin, e.c, sc, parallel)
						cur = f
					}
					f.measure(b, sc, parallel)
				})
			}
		}
	}
}

// compareFixture is a contender built for one sub-benchmark, with its own
// Redis client.
type compareFixture struct {
	fixture
	rdb   *redis.Client
	hook  *tripCounter
	admin *redis.Client // the benchmark's, reads the server's CPU time (serverCPU); nil for in-process contenders
}

// newCompareFixture flushes Redis, so that no sub-benchmark sees another's
// keys, then builds c on a new client and warms it on sc, in the mode it
// will be measured in.
func newCompareFixture(b *testing.B, srv *redistest.Server, admin *redis.Client, c contender, sc scenario, parallel bool) *compareFixture {
	if err := admin.FlushAll(context.Background()).Err(); err != nil {
		b.Fatalf("FLUSHALL: %v", err)
	}
	// Every contender's client as tierlimit's docs recommend: context
	// deadlines honoured (no call here has one but hybrid's, which then
	// claims on the caller's goroutine).
	return buildCompareFixture(b, srv, admin, c, sc, parallel, true)
}

// buildCompareFixture builds c on a new client, which honours context
// deadlines if deadlines is set, and warms it on sc, in the mode it will be
// measured in. admin, the caller's, reads the server's CPU time for it.
func buildCompareFixture(b *testing.B, srv *redistest.Server, admin *redis.Client, c contender, sc scenario, parallel, deadlines bool) *compareFixture {
	f := &compareFixture{hook: new(tripCounter)}
	if c.where != inProcess {
		f.rdb = redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true, ContextTimeoutEnabled: deadlines})
		f.rdb.AddHook(f.hook)
		f.admin = admin
	}
	var err error
	if f.fixture, err = c.build(f.rdb, compareLimit); err != nil {
		b.Fatalf("build %s for %v: %v", c.name, compareLimit, err)
	}
	calls := 1000
	if c.where != perCall {
		calls = max(calls, warmPasses*len(sc.keys))
	}
	f.warm(b, c.name, sc, parallel, calls)
	return f
}

// warm drives the fixture through sc for warmFor, and until it has made
// calls decisions or warmMax has passed, from one goroutine or (parallel)
// from GOMAXPROCS: hybrid sizes its leases to the demand it sees, so a
// parallel benchmark needs a parallel warm-up to start from its own steady
// state.
func (f *compareFixture) warm(b *testing.B, name string, sc scenario, parallel bool, calls int) {
	ctx := context.Background()
	workers := 1
	if parallel {
		workers = runtime.GOMAXPROCS(0)
	}
	start := time.Now()
	var wg sync.WaitGroup
	var n, failed atomic.Int64
	var mu sync.Mutex
	var firstErr error
	for w := range workers {
		wg.Go(func() {
			for i := w * 7919; ; i++ {
				if d := time.Since(start); d >= warmFor && (i-w*7919 >= calls/workers || d >= warmMax) {
					return
				}
				n.Add(1)
				if _, _, err := f.allow(ctx, sc.key(i)); err != nil {
					failed.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if bad := failed.Load(); float64(bad) > maxErrorRate*float64(n.Load()) {
		b.Fatalf("%s: %d of %d warm-up calls failed, first: %v", name, bad, n.Load(), firstErr)
	}
}

// release closes the limiter and its client.
func (f *compareFixture) release(b *testing.B) {
	if err := f.close(); err != nil {
		b.Error(err)
	}
	if f.rdb != nil {
		_ = f.rdb.Close()
	}
}

// maxErrorRate is the share of calls that may fail before the benchmark
// does. throttled's compare-and-swap gives up after 10 lost races, which
// two goroutines on one key do cause (about 1 call in 100 to 1000); those
// errors are reported as errors/op. A higher share is a broken set-up.
const maxErrorRate = 0.1

// maxFallbackRate is the share of hybrid's decisions that may fall back to
// its in-process limiter (a Redis call over its 25 ms budget on this busy
// machine) before the benchmark fails: more would measure the fallback.
const maxFallbackRate = 1e-3

// fallbackCount returns the fixture's fallback decisions so far, or 0.
func (f *compareFixture) fallbackCount() int64 {
	if f.fallbacks == nil {
		return 0
	}
	return f.fallbacks()
}

// measure times the fixture's decisions over sc and reports the metrics.
func (f *compareFixture) measure(b *testing.B, sc scenario, parallel bool) {
	ctx := context.Background()
	trips0, cmds0 := f.hook.load()
	fb0 := f.fallbackCount()
	var cpu0 int64
	if f.admin != nil {
		cpu0 = serverCPU(b, f.admin)
	}
	self0 := processCPU(b)
	var allowed, errs int64
	var firstErr error
	b.ReportAllocs()
	// The first call of a sample built and warmed the fixture with the
	// timer running; RunParallel would count that.
	b.ResetTimer()
	if parallel {
		var mu sync.Mutex
		var seed int
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			seed++
			i := seed * 7919 // each goroutine starts elsewhere in the sequence
			mu.Unlock()
			var ok, bad int64
			var err1 error
			for pb.Next() {
				i++
				a, _, err := f.allow(ctx, sc.key(i))
				switch {
				case err != nil:
					bad++
					if err1 == nil {
						err1 = err
					}
				case a:
					ok++
				}
			}
			mu.Lock()
			allowed, errs = allowed+ok, errs+bad
			if firstErr == nil {
				firstErr = err1
			}
			mu.Unlock()
		})
	} else {
		i := 0
		for b.Loop() {
			i++
			a, _, err := f.allow(ctx, sc.key(i))
			switch {
			case err != nil:
				errs++
				if firstErr == nil {
					firstErr = err
				}
			case a:
				allowed++
			}
		}
	}
	b.StopTimer()
	self1 := processCPU(b)
	trips1, cmds1 := f.hook.load()
	n := float64(b.N)
	b.ReportMetric(float64(self1-self0)/n, "cpu-ns/op")
	redisCPU := 0.0 // an in-process contender's Redis does nothing for it
	if f.admin != nil {
		redisCPU = float64(serverCPU(b, f.admin)-cpu0) / n
	}
	b.ReportMetric(redisCPU, "redis-cpu-ns/op")
	if fb := f.fallbackCount() - fb0; fb > 0 {
		b.Logf("%d of %d decisions fell back to the in-process limiter", fb, b.N)
		if float64(fb) > maxFallbackRate*n {
			b.Fatalf("%d of %d decisions fell back (more than %g)", fb, b.N, maxFallbackRate)
		}
		b.ReportMetric(float64(fb)/n, "fallbacks/op")
	}
	if errs > 0 {
		b.Logf("%d of %d calls failed, first: %v", errs, b.N, firstErr)
		if float64(errs) > maxErrorRate*n {
			b.Fatalf("%d of %d calls failed (more than %g)", errs, b.N, maxErrorRate)
		}
		b.ReportMetric(float64(errs)/n, "errors/op")
	}
	b.ReportMetric(float64(trips1-trips0)/n, "redis-calls/op")
	b.ReportMetric(float64(cmds1-cmds0)/n, "redis-cmds/op")
	b.ReportMetric(float64(allowed)/n, "allowed/op")
}

// processCPU returns the CPU time this process has used, user and system,
// in ns (getrusage RUSAGE_SELF): a decision's whole cost to the service,
// its background goroutines, go-redis and the garbage collector included.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// serverCPU returns the CPU time the redis-server rdb is connected to has
// used, user and system, in ns (INFO cpu). Redis shares the benchmark's
// cores: what it spends per decision is a contender's cost too.
func serverCPU(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatalf("INFO cpu: %v", err)
	}
	var ns int64
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k != "used_cpu_sys" && k != "used_cpu_user" {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu: %s: %v", line, err)
		}
		ns += int64(sec * 1e9)
	}
	return ns
}

// tripCounter is a go-redis hook counting round trips (a command, or a
// pipeline or transaction of any length) and the commands they carry.
// It is safe for concurrent use.
type tripCounter struct{ trips, cmds atomic.Int64 }

func (h *tripCounter) load() (trips, cmds int64) { return h.trips.Load(), h.cmds.Load() }

// DialHook passes dials through.
func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts one round trip of one command.
func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts one round trip of len(cmds) commands.
func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
