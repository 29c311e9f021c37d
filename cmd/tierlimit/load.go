package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/histogram"
)

// keySpace is the keys a run draws from: uniformly, or Zipf-skewed with
// parameter s > 1 (key 0 the hottest). Key names are unique to the run, so
// that every run starts from full buckets.
type keySpace struct {
	names []string
	zipf  float64 // 0: uniform
}

func newKeySpace(run string, n int, zipf float64) keySpace {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s:%d", run, i)
	}
	return keySpace{names: names, zipf: zipf}
}

// picker draws key indexes; each worker has its own.
type picker struct {
	r    *rand.Rand
	z    *rand.Zipf
	keys int
}

func (ks keySpace) picker(seed uint64) *picker {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &picker{r: r, keys: len(ks.names)}
	if ks.zipf > 0 && len(ks.names) > 1 {
		p.z = rand.NewZipf(r, ks.zipf, 1, uint64(len(ks.names)-1))
	}
	return p
}

func (p *picker) next() int {
	switch {
	case p.keys == 1:
		return 0
	case p.z != nil:
		return int(p.z.Uint64())
	default:
		return p.r.IntN(p.keys)
	}
}

// hotKeys is how many of the first (hottest) keys each worker tallies in a
// private array: a shared counter for a hot key would make the workers
// contend on it and slow the fastest strategies down. Colder keys go to
// shared atomic counters, which are rarely touched twice at once.
const hotKeys = 4096

// measurement is what one closed-loop run of a strategy saw.
type measurement struct {
	strategy  string
	decisions int64 // calls that returned a decision, not an error
	admitted  int64
	allowed   int64 // the most the limit lets through for the demand seen
	errors    int64
	firstErr  string
	calls     int64 // Redis script calls
	fallback  int64 // hybrid decisions made by the local fallback
	elapsed   time.Duration
	latency   histogram.Histogram
}

// perSecond returns decisions per second.
func (m *measurement) perSecond() float64 { return float64(m.decisions) / m.elapsed.Seconds() }

// callsPer1000 returns Redis calls per 1000 decisions.
func (m *measurement) callsPer1000() float64 {
	if m.decisions == 0 {
		return 0
	}
	return 1000 * float64(m.calls) / float64(m.decisions)
}

// latencyEvery: one decision in latencyEvery is timed, with two clock
// reads; the others are only counted. Timing every decision would slow the
// in-process strategies, whose decisions take about as long as a clock read.
const latencyEvery = 8

// yieldEvery: a worker yields its processor every yieldEvery decisions.
// Workers never block on the in-process strategies, and Go preempts a
// running goroutine only every 10 ms: without yielding, the goroutines of
// an embedded Redis and of a hybrid claim wait behind them for tens of
// milliseconds, and the claim misses its budget. Request handlers block on
// I/O; yielding stands for that.
const yieldEvery = 64

// worker is one goroutine of a closed-loop run.
type worker struct {
	pick               *picker
	hot                []uint64 // decisions per key, for keys < hotKeys
	decisions, allowed int64
	errors             int64
	firstErr           error
	latency            histogram.Histogram
}

// hammer runs f's members as fast as they go for d, conc goroutines per
// member, over keys, and measures them.
func hammer(ctx context.Context, f *fleet, ks keySpace, conc int, d time.Duration) measurement {
	cold := make([]atomic.Uint64, max(0, len(ks.names)-hotKeys))
	workers := make([]*worker, 0, len(f.members)*conc)
	for i := range len(f.members) * conc {
		workers = append(workers, &worker{pick: ks.picker(uint64(i) + 1), hot: make([]uint64, min(len(ks.names), hotKeys))})
	}
	callsBefore, fallbackBefore := f.calls.Calls(), f.hybridStats().Fallback
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, f.members[i/conc], ks.names, cold, deadline)
		}()
	}
	wg.Wait()
	m := measurement{strategy: f.strategy, elapsed: time.Since(start), calls: f.calls.Calls() - callsBefore,
		fallback: f.hybridStats().Fallback - fallbackBefore}
	demand := make([]uint64, len(ks.names))
	for _, w := range workers {
		m.decisions += w.decisions
		m.admitted += w.allowed
		m.errors += w.errors
		if w.firstErr != nil && m.firstErr == "" {
			m.firstErr = w.firstErr.Error()
		}
		m.latency.Merge(&w.latency)
		for k, n := range w.hot {
			demand[k] += n
		}
	}
	for k := range cold {
		demand[hotKeys+k] = cold[k].Load()
	}
	m.allowed = allowed(f.limit.Capacity(), f.limit.Rate, f.limit.Period, m.elapsed, demand)
	return m
}

// allowed returns the most a token bucket of capacity, refilled at rate per
// period and full at the start, admits over elapsed given each key's demand:
// the sum over keys of min(demand, capacity + rate·elapsed/period).
func allowed(capacity, rate int64, period, elapsed time.Duration, demand []uint64) int64 {
	bound := uint64(capacity) + uint64(float64(rate)*elapsed.Seconds()/period.Seconds())
	var sum uint64
	for _, n := range demand {
		sum += min(n, bound)
	}
	return int64(sum)
}

// run decides until deadline or ctx is done.
func (w *worker) run(ctx context.Context, lim tierlimit.Limiter, keys []string, cold []atomic.Uint64, deadline time.Time) {
	for n := 0; ; n++ {
		k := w.pick.next()
		var t0 time.Time
		timed := n%latencyEvery == 0
		if timed {
			t0 = time.Now()
			if t0.After(deadline) || ctx.Err() != nil {
				return
			}
		}
		res, err := lim.AllowN(ctx, keys[k], 1)
		if timed {
			w.latency.Add(time.Since(t0))
		}
		if n%yieldEvery == 0 {
			runtime.Gosched()
		}
		if k < len(w.hot) {
			w.hot[k]++
		} else {
			cold[k-len(w.hot)].Add(1)
		}
		switch {
		case err != nil:
			w.errors++
			if w.firstErr == nil {
				w.firstErr = err
			}
		case res.Allowed:
			w.allowed++
			w.decisions++
		default:
			w.decisions++
		}
	}
}
