package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/remote"
)

func mustNew(t *testing.T, opts ...Option) *Collector {
	t.Helper()
	c, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// zeroDecisions is the exposition of the decision series an Observer
// creates up front, at 0, for a limiter, besides the ones a test sets.
func decisionLines(limiter string, set map[string]int) string {
	var b strings.Builder
	for _, src := range []string{"blocked", "fallback", "local", "remote"} {
		for _, res := range []string{"allowed", "denied"} {
			fmt.Fprintf(&b, "tierlimit_decisions_total{limiter=%q,result=%q,source=%q} %d\n",
				limiter, res, src, set[src+"/"+res])
		}
	}
	return b.String()
}

// TestObserverCounts feeds an Observer by hand and checks the exposition.
func TestObserverCounts(t *testing.T) {
	c := mustNew(t, WithDecisionBuckets(1e-3, 1e-2), WithRedisBuckets(1e-2))
	o := c.Observer("api")
	for range 3 {
		o.Decision(tierlimit.Decision{Allowed: true, Source: tierlimit.SourceLocal, N: 1, Latency: 500 * time.Microsecond})
	}
	o.Decision(tierlimit.Decision{Allowed: false, Source: tierlimit.SourceBlocked, N: 1, Latency: 2 * time.Millisecond})
	o.Decision(tierlimit.Decision{Allowed: true, Source: tierlimit.SourceRemote, N: 2, Latency: 20 * time.Millisecond})
	o.RedisCall(tierlimit.RedisCall{Op: "claim", Latency: time.Millisecond})
	o.RedisCall(tierlimit.RedisCall{Op: "claim", Latency: 30 * time.Millisecond, Err: errors.New("i/o timeout")})
	o.RedisCall(tierlimit.RedisCall{Op: "refund", Latency: time.Millisecond})
	o.Breaker(tierlimit.BreakerChange{From: tierlimit.BreakerClosed, To: tierlimit.BreakerOpen})

	want := `
# HELP tierlimit_decisions_total Decisions made, by the tier that made them and their result.
# TYPE tierlimit_decisions_total counter
` + decisionLines("api", map[string]int{"local/allowed": 3, "blocked/denied": 1, "remote/allowed": 1}) + `
# HELP tierlimit_redis_calls_total Round trips to Redis (script calls and pipelines), failed or not.
# TYPE tierlimit_redis_calls_total counter
tierlimit_redis_calls_total{limiter="api",op="claim"} 2
tierlimit_redis_calls_total{limiter="api",op="refund"} 1
# HELP tierlimit_redis_errors_total Round trips to Redis that failed or ran out of time.
# TYPE tierlimit_redis_errors_total counter
tierlimit_redis_errors_total{limiter="api",op="claim"} 1
# HELP tierlimit_breaker_transitions_total Changes of state of the circuit breaker in front of Redis.
# TYPE tierlimit_breaker_transitions_total counter
tierlimit_breaker_transitions_total{from="closed",limiter="api",to="open"} 1
# HELP tierlimit_redis_call_duration_seconds Round-trip time of calls to Redis.
# TYPE tierlimit_redis_call_duration_seconds histogram
tierlimit_redis_call_duration_seconds_bucket{limiter="api",op="claim",le="0.01"} 1
tierlimit_redis_call_duration_seconds_bucket{limiter="api",op="claim",le="+Inf"} 2
tierlimit_redis_call_duration_seconds_sum{limiter="api",op="claim"} 0.031
tierlimit_redis_call_duration_seconds_count{limiter="api",op="claim"} 2
tierlimit_redis_call_duration_seconds_bucket{limiter="api",op="refund",le="0.01"} 1
tierlimit_redis_call_duration_seconds_bucket{limiter="api",op="refund",le="+Inf"} 1
tierlimit_redis_call_duration_seconds_sum{limiter="api",op="refund"} 0.001
tierlimit_redis_call_duration_seconds_count{limiter="api",op="refund"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"tierlimit_decisions_total", "tierlimit_redis_calls_total", "tierlimit_redis_errors_total",
		"tierlimit_breaker_transitions_total", "tierlimit_redis_call_duration_seconds"); err != nil {
		t.Error(err)
	}

	// The decision histogram: local ones below 1 ms, the blocked one
	// below 10 ms, the remote one above.
	for _, tc := range []struct {
		src   string
		count uint64
		sum   float64
	}{{"local", 3, 1.5e-3}, {"blocked", 1, 2e-3}, {"remote", 1, 20e-3}, {"fallback", 0, 0}} {
		h := histogram(t, c, "tierlimit_decision_duration_seconds", map[string]string{"limiter": "api", "source": tc.src})
		if h.GetSampleCount() != tc.count || math.Abs(h.GetSampleSum()-tc.sum) > 1e-9 {
			t.Errorf("decision_duration_seconds{source=%q}: count %d, sum %g; want %d, %g",
				tc.src, h.GetSampleCount(), h.GetSampleSum(), tc.count, tc.sum)
		}
	}
}

// TestObserverEviction: the eviction gauges follow the readings reported.
func TestObserverEviction(t *testing.T) {
	tests := []struct {
		name string
		risk tierlimit.EvictionRisk
		want string
	}{
		{"risky", tierlimit.EvictionRisk{Policy: "allkeys-lru", MaxMemory: 1 << 20, EvictedKeys: 7}, "1 7"},
		{"noeviction", tierlimit.EvictionRisk{Policy: "noeviction", MaxMemory: 1 << 20}, "0 0"},
		{"no maxmemory", tierlimit.EvictionRisk{Policy: "allkeys-lru"}, "0 0"},
		{"unknown", tierlimit.EvictionRisk{Err: errors.New("INFO refused")}, "-1 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustNew(t)
			c.Observer("api").Eviction(tt.risk)
			risk := testutil.ToFloat64(c.evictRisk.WithLabelValues("api"))
			evicted := testutil.ToFloat64(c.evicted.WithLabelValues("api"))
			if got := fmt.Sprintf("%g %g", risk, evicted); got != tt.want {
				t.Errorf("redis_eviction_risk, redis_evicted_keys after %+v = %s, want %s", tt.risk, got, tt.want)
			}
		})
	}
}

// histogram gathers c and returns the histogram of name with labels.
func histogram(t *testing.T, c prometheus.Collector, name string, labels map[string]string) interface {
	GetSampleCount() uint64
	GetSampleSum() float64
} {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			return m.GetHistogram()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return nil
}

// TestObserverOnRemote wires an Observer into a real remote limiter.
func TestObserverOnRemote(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := mustNew(t)
	tb, err := remote.NewTokenBucket(rdb, tierlimit.PerHour(3), remote.WithObserver(c.Observer("login")))
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := tb.Allow(context.Background(), "user:1"); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP tierlimit_decisions_total Decisions made, by the tier that made them and their result.
# TYPE tierlimit_decisions_total counter
` + decisionLines("login", map[string]int{"remote/allowed": 3, "remote/denied": 1}) + `
# HELP tierlimit_redis_calls_total Round trips to Redis (script calls and pipelines), failed or not.
# TYPE tierlimit_redis_calls_total counter
tierlimit_redis_calls_total{limiter="login",op="allow"} 4
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "tierlimit_decisions_total", "tierlimit_redis_calls_total"); err != nil {
		t.Error(err)
	}
}

// TestWatchHybrid checks that a hybrid limiter's ledger and breaker are
// exported as its Stats say.
func TestWatchHybrid(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := mustNew(t)
	h, err := hybrid.New(rdb, tierlimit.PerMinute(100), hybrid.WithObserver(c.Observer("api")))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := c.WatchHybrid("api", h); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if _, err := h.Allow(context.Background(), fmt.Sprintf("k%d", i%3)); err != nil {
			t.Fatal(err)
		}
	}
	// Background refunds may move the ledger between Stats and the
	// scrape: retry until both agree with a Stats taken after.
	var lastErr error
	for range 50 {
		s := h.Stats()
		want := fmt.Sprintf(`
# HELP tierlimit_hybrid_tokens_leased_total Tokens claimed from Redis into leases.
# TYPE tierlimit_hybrid_tokens_leased_total counter
tierlimit_hybrid_tokens_leased_total{limiter="api"} %d
# HELP tierlimit_hybrid_tokens_spent_total Leased tokens that admitted a request.
# TYPE tierlimit_hybrid_tokens_spent_total counter
tierlimit_hybrid_tokens_spent_total{limiter="api"} %d
# HELP tierlimit_hybrid_tokens_refunded_total Leased tokens given back to Redis unspent.
# TYPE tierlimit_hybrid_tokens_refunded_total counter
tierlimit_hybrid_tokens_refunded_total{limiter="api"} %d
# HELP tierlimit_hybrid_tokens_lost_total Leased tokens that could not be refunded (Redis unreachable); never spent.
# TYPE tierlimit_hybrid_tokens_lost_total counter
tierlimit_hybrid_tokens_lost_total{limiter="api"} %d
# HELP tierlimit_hybrid_tokens_held Tokens in leases now.
# TYPE tierlimit_hybrid_tokens_held gauge
tierlimit_hybrid_tokens_held{limiter="api"} %d
# HELP tierlimit_breaker_state State of the circuit breaker in front of Redis: 1 for the current state.
# TYPE tierlimit_breaker_state gauge
tierlimit_breaker_state{limiter="api",state="closed"} 1
tierlimit_breaker_state{limiter="api",state="half-open"} 0
tierlimit_breaker_state{limiter="api",state="open"} 0
# HELP tierlimit_hybrid_instances Live instances of the fleet, as last seen in Redis.
# TYPE tierlimit_hybrid_instances gauge
tierlimit_hybrid_instances{limiter="api"} %d
`, s.Leased, s.Spent, s.Refunded, s.Lost, s.Held, s.Instances)
		lastErr = testutil.CollectAndCompare(c, strings.NewReader(want),
			"tierlimit_hybrid_tokens_leased_total", "tierlimit_hybrid_tokens_spent_total",
			"tierlimit_hybrid_tokens_refunded_total", "tierlimit_hybrid_tokens_lost_total",
			"tierlimit_hybrid_tokens_held", "tierlimit_breaker_state", "tierlimit_hybrid_instances")
		if lastErr == nil && reflect.DeepEqual(h.Stats(), s) {
			break
		}
	}
	if lastErr != nil {
		t.Error(lastErr)
	}
	// A claim that misses its call budget (a loaded machine, -race) is
	// denied, not minted: count what was decided, whichever way.
	s := h.Stats()
	if s.Leased == 0 || s.Allowed+s.Denied != 30 || s.Spent != s.Allowed {
		t.Errorf("Stats = %+v, want leases taken, 30 decisions and every admission spent from a lease", s)
	}
	// The hybrid limiter's own decisions come through its observer.
	var allowed, denied float64
	for _, src := range []string{"local", "remote", "blocked", "fallback"} {
		allowed += testutil.ToFloat64(c.decisions.WithLabelValues("api", src, "allowed"))
		denied += testutil.ToFloat64(c.decisions.WithLabelValues("api", src, "denied"))
	}
	if allowed != float64(s.Allowed) || denied != float64(s.Denied) {
		t.Errorf("decisions counted %v allowed, %v denied; want %d, %d as Stats", allowed, denied, s.Allowed, s.Denied)
	}

	if err := c.WatchHybrid("api", h); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WatchHybrid of a watched name = %v, want ErrInvalidOption", err)
	}
	if err := c.WatchHybrid("other", nil); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WatchHybrid(nil) = %v, want ErrInvalidOption", err)
	}
}

// TestLint checks the metrics against Prometheus' naming conventions, and
// that every one registers with a pedantic registry.
func TestLint(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := mustNew(t)
	h, err := hybrid.New(rdb, tierlimit.PerMinute(100))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := c.WatchHybrid("api", h); err != nil {
		t.Fatal(err)
	}
	o := c.Observer("api")
	o.RedisCall(tierlimit.RedisCall{Op: "claim", Latency: time.Millisecond, Err: errors.New("x")})
	o.Breaker(tierlimit.BreakerChange{From: tierlimit.BreakerOpen, To: tierlimit.BreakerHalfOpen})
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if err := prometheus.NewPedanticRegistry().Register(c); err != nil {
		t.Errorf("Register with a pedantic registry: %v", err)
	}
	if n := testutil.CollectAndCount(c); n < 20 {
		t.Errorf("collected %d metrics, want every family", n)
	}
}

// TestLabelValues checks that names that are not UTF-8 do not break a
// scrape.
func TestLabelValues(t *testing.T) {
	c := mustNew(t)
	o := c.Observer("bad\xff")
	o.RedisCall(tierlimit.RedisCall{Op: "op\xfe"})
	o.Decision(tierlimit.Decision{Source: tierlimit.Source(9)})
	if _, err := testutil.CollectAndLint(c); err != nil {
		t.Errorf("collect: %v", err)
	}
	if got := testutil.ToFloat64(c.decisions.WithLabelValues("bad\uFFFD", "unknown", "denied")); got != 1 {
		t.Errorf("decision of an unknown source counted %v, want 1", got)
	}
}

// TestBadOptions checks that New refuses bad options with typed errors.
func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"nil", nil},
		{"empty namespace", WithNamespace("")},
		{"namespace with a digit first", WithNamespace("1x")},
		{"namespace with a dash", WithNamespace("tier-limit")},
		{"no buckets", WithDecisionBuckets()},
		{"decreasing", WithDecisionBuckets(0.1, 0.01)},
		{"repeated", WithRedisBuckets(0.1, 0.1)},
		{"negative", WithRedisBuckets(-1)},
		{"infinite", WithRedisBuckets(1, math.Inf(1))},
		{"NaN", WithDecisionBuckets(math.NaN())},
	} {
		if c, err := New(tc.opt); c != nil || !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("New(%s) = %v, %v; want nil, an error wrapping ErrInvalidOption", tc.name, c, err)
		}
	}
	c := mustNew(t, WithNamespace("edge"))
	c.Observer("x").RedisCall(tierlimit.RedisCall{Op: "allow"})
	if n := testutil.CollectAndCount(c, "edge_redis_calls_total"); n != 1 {
		t.Errorf("WithNamespace(\"edge\"): %d edge_redis_calls_total series, want 1", n)
	}
}
