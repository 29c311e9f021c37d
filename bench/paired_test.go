package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// pairedContenders are BenchmarkComparePaired's contenders, by name in
// contenders: the last is the baseline.
var pairedContenders = []string{"local", "hybrid", "syncmap_xrate"}

// pairedBatch is the number of decisions each contender makes in turn: a
// batch long enough that a contender finds its keys in the caches it left
// (batches of 256 make all three miss them, and run at about the same
// speed), short enough that a slow spell of the machine falls on all.
const pairedBatch = 1 << 15

// BenchmarkComparePaired is BenchmarkCompare for local, hybrid and the
// sync.Map of x/time/rate, timed in alternating batches of pairedBatch
// decisions, so that a slow spell of a shared machine falls on all of them
// alike. Each contender is built and warmed as BenchmarkCompare does, hybrid
// on go-redis's default client (client=default) and on one with
// ContextTimeoutEnabled (client=deadlines). It reports, per contender, the
// mean ns per decision (name-ns) and its ratio to the baseline's
// (name-x). In the parallel mode every goroutine alternates on its own and
// the times are summed over them. The framework's ns/op is one round of
// batches.
//
// hybrid's ratio here is kinder than BenchmarkCompare's: its background
// claims, renewals and refunds keep Redis busy after its batch, during the
// others', on the same cores. The serial mode reports how much: the CPU
// time redis-server used during each contender's batches, per decision
// (name-redis-ns); local and the sync.Map use Redis not at all, so what
// theirs shows is hybrid's. BenchmarkCompare, which runs one contender at a
// time, is the measure of hybrid against the others.
func BenchmarkComparePaired(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	for _, sc := range scenarios() {
		if sc.name == "hot" {
			continue
		}
		for _, parallel := range []bool{false, true} {
			mode := "serial"
			if parallel {
				mode = "parallel"
			}
			for _, client := range []string{"default", "deadlines"} {
				b.Run(sc.name+"/"+mode+"/client="+client, func(b *testing.B) {
					runPaired(b, srv, admin, sc, parallel, client == "deadlines")
				})
			}
		}
	}
}

func runPaired(b *testing.B, srv *redistest.Server, admin *redis.Client, sc scenario, parallel, deadlines bool) {
	ctx := context.Background()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		b.Fatalf("FLUSHALL: %v", err)
	}
	fs := make([]*compareFixture, len(pairedContenders))
	for i, name := range pairedContenders {
		f := buildCompareFixture(b, srv, admin, contenderNamed(b, name), sc, parallel, deadlines)
		b.Cleanup(func() { f.release(b) })
		fs[i] = f
	}
	var mu sync.Mutex
	ns := make([]time.Duration, len(fs))
	calls := 0
	server := make([]int64, len(fs)) // redis-server's CPU ns during each one's batches
	round := func(i *int, own []time.Duration) {
		for j, f := range fs {
			var cpu0 int64
			if !parallel {
				cpu0 = serverCPU(b, admin)
			}
			t0 := time.Now()
			for range pairedBatch {
				*i++
				if _, _, err := f.allow(ctx, sc.key(*i)); err != nil {
					b.Errorf("%s: %v", pairedContenders[j], err)
					return
				}
			}
			own[j] += time.Since(t0)
			if !parallel {
				server[j] += serverCPU(b, admin) - cpu0
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		var seed int
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			seed++
			i := seed * 7919
			mu.Unlock()
			own := make([]time.Duration, len(fs))
			n := 0
			for pb.Next() {
				round(&i, own)
				n++
			}
			mu.Lock()
			for j := range ns {
				ns[j] += own[j]
			}
			calls += n * pairedBatch
			mu.Unlock()
		})
	} else {
		i := 0
		for b.Loop() {
			round(&i, ns)
			calls += pairedBatch
		}
	}
	b.StopTimer()
	base := float64(ns[len(ns)-1])
	for j, name := range pairedContenders {
		b.ReportMetric(float64(ns[j])/float64(calls), name+"-ns")
		if !parallel {
			b.ReportMetric(float64(server[j])/float64(calls), name+"-redis-ns")
		}
		if j < len(ns)-1 {
			b.ReportMetric(float64(ns[j])/base, name+"-x")
		}
	}
}

// contenderNamed returns the contender of that name.
func contenderNamed(b *testing.B, name string) contender {
	for _, c := range contenders {
		if c.name == name {
			return c
		}
	}
	b.Fatalf("no contender %q", name)
	return contender{}
}
