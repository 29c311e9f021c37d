package tierlimit_test

// Redis hazards that do not stop the limiters but that an operator must
// learn of: a server that may evict limiter keys, and calls that run past
// their budget.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/metrics"
)

// logLines sends slog's default logger to a buffer until the test ends,
// and returns a func that reads the lines logged so far.
func logLines(t *testing.T) func() []string {
	t.Helper()
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.FieldsFunc(buf.String(), func(r rune) bool { return r == '\n' })
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// TestEvictionRiskAtNew: with a server that may evict limiter keys, every
// tier that uses Redis reports it at New: through the observer, its own
// reading (Stats.Eviction, Eviction), the metrics of a Collector whose
// Observer it was given (tierlimit_redis_eviction_risk 1, and
// tierlimit_redis_evicted_keys as read) and one log line; a server that
// refuses INFO is reported as unknown (gauge -1), once; a safe one is not
// reported as risky (gauge 0) and logs nothing.
func TestEvictionRiskAtNew(t *testing.T) {
	ctx := context.Background()
	restricted := redistest.Start(t, "--requirepass", "secret")
	if err := restricted.Client(t).Do(ctx, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	setups := []struct {
		name         string
		opts         redis.Options
		risky, known bool
	}{
		{"allkeys-lru", redis.Options{Addr: redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru").Addr}, true, true},
		{"volatile-ttl", redis.Options{Addr: redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "volatile-ttl").Addr}, true, true},
		{"noeviction", redis.Options{Addr: redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "noeviction").Addr}, false, true},
		{"no maxmemory", redis.Options{Addr: redistest.Start(t, "--maxmemory-policy", "allkeys-lru").Addr}, false, true},
		{"INFO refused", redis.Options{Addr: restricted.Addr, Username: "noinfo", Password: "pw"}, false, false},
	}
	for _, s := range setups {
		for _, tier := range tiers {
			if !tier.redis {
				continue
			}
			t.Run(s.name+"/"+tier.name, func(t *testing.T) {
				lines := logLines(t)
				opts := s.opts
				rdb := redis.NewClient(&opts)
				defer rdb.Close()
				col, err := metrics.New()
				if err != nil {
					t.Fatal(err)
				}
				var reported []tierlimit.EvictionRisk
				var mu sync.Mutex
				o := col.Observer("api")
				toGauges := o.Eviction
				o.Eviction = func(r tierlimit.EvictionRisk) {
					mu.Lock()
					reported = append(reported, r)
					mu.Unlock()
					toGauges(r)
				}
				l, err := tier.new(rdb, tierlimit.PerSecond(10), tierOptions{observer: o})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				read := evictionOf(l)
				if read.Risky() != s.risky || read.Known() != s.known {
					t.Errorf("reading at New = %v: Risky %v, Known %v; want %v, %v", read, read.Risky(), read.Known(), s.risky, s.known)
				}
				mu.Lock()
				if len(reported) != 1 || reported[0].Risky() != s.risky || reported[0].Known() != s.known {
					t.Errorf("observer got %v at New, want one reading (Risky %v, Known %v)", reported, s.risky, s.known)
				}
				mu.Unlock()
				wantRisk := map[bool]float64{true: 1, false: 0}[s.risky]
				if !s.known {
					wantRisk = -1
				}
				if got, ok := gaugeOf(t, col, "tierlimit_redis_eviction_risk", "api"); !ok || got != wantRisk {
					t.Errorf("tierlimit_redis_eviction_risk{limiter=\"api\"} right after New = %v (exported: %v), want %v", got, ok, wantRisk)
				}
				if got, ok := gaugeOf(t, col, "tierlimit_redis_evicted_keys", "api"); !ok || got != float64(read.EvictedKeys) {
					t.Errorf("tierlimit_redis_evicted_keys{limiter=\"api\"} right after New = %v (exported: %v), want %d as read", got, ok, read.EvictedKeys)
				}
				var warned int
				for _, l := range lines() {
					if strings.Contains(l, "evict") {
						warned++
					}
				}
				if want := map[bool]int{true: 1, false: 0}[s.risky || !s.known]; warned != want {
					t.Errorf("%d log lines about eviction, want %d: %q", warned, want, lines())
				}
			})
		}
	}
}

// gaugeOf returns the value of the gauge name{limiter} that c exports, and
// whether c exports exactly one series of it.
func gaugeOf(t *testing.T, c prometheus.Collector, name, limiter string) (float64, bool) {
	t.Helper()
	if n := testutil.CollectAndCount(c, name); n != 1 {
		return 0, false
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "limiter" && lp.GetValue() == limiter && m.GetGauge() != nil {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestEvictionRiskOnCluster: on a 3-master Cluster, one master that may
// evict makes the risk known at New, whichever master holds the fleet's
// keys.
func TestEvictionRiskOnCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	rdb := c.Client(t)
	ctx := context.Background()
	l, err := hybrid.New(rdb, tierlimit.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().Eviction; !got.Known() || got.Risky() {
		t.Errorf("Stats.Eviction on a cluster without maxmemory = %v, want known and safe", got)
	}
	l.Close()
	risky := c.Nodes[len(c.Nodes)-1].Client(t)
	if err := risky.ConfigSet(ctx, "maxmemory", "512mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := risky.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	l, err = hybrid.New(rdb, tierlimit.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Stats().Eviction; !got.Risky() || got.Policy != "volatile-lru" {
		t.Errorf("Stats.Eviction with one master under volatile-lru = %v, want that risk", got)
	}
}

// TestSlowCallsAreErrors: a server busy in DEBUG SLEEP opens the breaker
// of a hybrid limiter with default options and go-redis's default client,
// by slowness alone. Every call that ran past its budget is a failed call
// in Stats, to the observer and in the metric alike.
func TestSlowCallsAreErrors(t *testing.T) {
	s := redistest.Start(t, "--enable-debug-command", "yes")
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	col, err := metrics.New()
	if err != nil {
		t.Fatal(err)
	}
	var observed atomic.Int64
	inner := col.Observer("api")
	obs := *inner
	obs.RedisCall = func(rc tierlimit.RedisCall) {
		if rc.Err != nil {
			observed.Add(1)
		}
		inner.RedisCall(rc)
	}
	l, err := hybrid.New(rdb, tierlimit.PerSecond(1000), hybrid.WithObserver(&obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	slept := make(chan error, 1)
	admin := s.Client(t)
	go func() { slept <- admin.Do(context.Background(), "DEBUG", "SLEEP", "1").Err() }()
	time.Sleep(50 * time.Millisecond) // DEBUG SLEEP has the server
	ctx := context.Background()
	deadline := time.Now().Add(900 * time.Millisecond)
	for i := 0; l.Stats().BreakerOpens == 0 && time.Now().Before(deadline); i++ {
		// A fresh key each time: each decision makes its own claim.
		if _, err := l.Allow(ctx, "k"+strconv.Itoa(i)); err != nil {
			t.Fatalf("Allow during the sleep = %v", err)
		}
	}
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the calls in flight return
	st := l.Stats()
	metric := sumOf(t, col, "tierlimit_redis_errors_total")
	t.Logf("stats %+v; observed errors %d; metric %g", st, observed.Load(), metric)
	if st.BreakerOpens == 0 {
		t.Fatalf("the breaker did not open during a 1 s DEBUG SLEEP: %+v", st)
	}
	// The breaker opens after 3 failures: calls over their budget, and a
	// failure for every further budget a call stays in flight.
	if st.RedisErrors == 0 {
		t.Errorf("Stats.RedisErrors = 0 with the breaker opened by slow calls")
	}
	if got := observed.Load(); got != st.RedisErrors || fmt.Sprint(metric) != fmt.Sprint(float64(got)) {
		t.Errorf("failed calls: Stats %d, observer %d, metric %g; want all equal", st.RedisErrors, got, metric)
	}
}

// sumOf returns the sum of every series of the counter name in c.
func sumOf(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestPausedRedisStopsTheWait: Redis paused for writes (CLIENT PAUSE
// WRITE) under 12 callers of one hot key, with default options and
// go-redis's default client. Only one claim per key is in flight at a time,
// yet the breaker learns from it while it stalls: it opens within a few
// call budgets, and from then on decisions stop waiting on Redis (a probe
// every probe interval may still make a few wait). No caller gets an error.
func TestPausedRedisStopsTheWait(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	// A limit the callers do not always reach: the key's lease runs dry
	// and needs Redis.
	l, err := hybrid.New(rdb, tierlimit.PerSecond(100_000))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	const callers, pause = 12, 2 * time.Second
	budget := hybrid.DefaultCallBudget
	var (
		stop            atomic.Bool
		settled         atomic.Int64 // unix ns from which waits are counted; 0: not yet
		decided, waited atomic.Int64
		errs            atomic.Int64
		wg              sync.WaitGroup
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				start := time.Now()
				if _, err := l.Allow(ctx, "hot"); err != nil {
					errs.Add(1)
				}
				if from := settled.Load(); from != 0 && start.UnixNano() >= from {
					decided.Add(1)
					if time.Since(start) >= budget {
						waited.Add(1)
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // leases claimed and spent
	admin := s.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	settled.Store(paused.Add(20 * budget).UnixNano())
	var opened time.Duration
	for time.Since(paused) < pause-100*time.Millisecond {
		if opened == 0 && l.Stats().BreakerOpens > 0 {
			opened = time.Since(paused)
		}
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("breaker opened %v into the pause; from 20 budgets into it: %d decisions, %d waited a budget or more; stats %+v",
		opened, decided.Load(), waited.Load(), l.Stats())
	if errs.Load() != 0 {
		t.Errorf("%d errors reached callers, want 0", errs.Load())
	}
	if opened == 0 || opened > 20*budget {
		t.Errorf("the breaker opened %v into the pause, want within %v (a few budgets)", opened, 20*budget)
	}
	if n, w := decided.Load(), waited.Load(); n == 0 || w*20 > n {
		t.Errorf("%d of %d decisions waited the budget once the breaker could know, want under 5%%", w, n)
	}
}
