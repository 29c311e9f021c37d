package otelbridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// newBridge returns a Bridge recording into an SDK MeterProvider read by
// the ManualReader returned.
func newBridge(t testing.TB, opts ...Option) (*Bridge, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	b, err := New(mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, reader
}

// sums collects reader and returns the int64 sums or gauges of the
// instrument name, by the attribute keys given, joined with ','.
func sums(t testing.TB, reader *sdkmetric.ManualReader, name string, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var points []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				points = d.DataPoints
			case metricdata.Gauge[int64]:
				points = d.DataPoints
			default:
				t.Fatalf("%s is a %T, want an int64 sum or gauge", name, m.Data)
			}
			for _, p := range points {
				label := ""
				for i, k := range keys {
					v, _ := p.Attributes.Value(k)
					if i > 0 {
						label += ","
					}
					label += v.String()
				}
				out[label] += p.Value
			}
		}
	}
	return out
}

func requireRedis(t *testing.T) {
	t.Helper()
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
}

// TestTotalsHybrid drives a hybrid limiter through every tier (leases,
// the blocked-key cache, Redis, and the fallback once Redis is stopped)
// and checks that the bridge's totals by source and result equal the
// limiter's own counts exactly.
func TestTotalsHybrid(t *testing.T) {
	requireRedis(t)
	s := redistest.Start(t)
	b, reader := newBridge(t)
	lim, err := hybrid.New(s.Client(t), tierlimit.PerMinute(20), hybrid.WithObserver(b.Observer("api")),
		hybrid.WithCallBudget(50*time.Millisecond), hybrid.WithProbeInterval(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	decide := func(n int) {
		for i := 0; i < n; i++ {
			for _, key := range []string{"a", "b", "c"} {
				if _, err := lim.AllowN(ctx, key, 1); err != nil {
					t.Fatalf("AllowN(%s): %v", key, err)
				}
			}
		}
	}
	decide(40) // past the limit: leases, then denials from Redis and the blocked cache
	s.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for lim.Stats().Fallback == 0 && time.Now().Before(deadline) {
		decide(1)
	}
	decide(5)
	st := lim.Stats()
	if st.Fallback == 0 || st.Local == 0 || st.Remote+st.Blocked == 0 {
		t.Fatalf("stats %+v: want decisions from leases, Redis or the blocked cache, and the fallback", st)
	}
	got := sums(t, reader, "tierlimit.rate_limiting.decisions", AttrSource, AttrResult)
	bySource := map[string]int64{}
	byResult := map[string]int64{}
	for k, v := range got {
		src, res, _ := strings.Cut(k, ",")
		bySource[src] += v
		byResult[res] += v
	}
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"local", bySource["local"], st.Local},
		{"blocked", bySource["blocked"], st.Blocked},
		{"remote", bySource["remote"], st.Remote},
		{"fallback", bySource["fallback"], st.Fallback},
		{"acquired", byResult[ResultAcquired], st.Allowed},
		{"rejected", byResult[ResultRejected], st.Denied},
	} {
		if c.got != c.want {
			t.Errorf("decisions %s = %d, want %d (Stats)", c.name, c.got, c.want)
		}
	}
	byLimit := sums(t, reader, "tierlimit.rate_limiting.limit_decisions", AttrLimit)
	var byLimitTotal int64
	for _, v := range byLimit {
		byLimitTotal += v
	}
	if byLimitTotal != st.Allowed+st.Denied {
		t.Errorf("limit_decisions = %v, %d in all; want %d", byLimit, byLimitTotal, st.Allowed+st.Denied)
	}
	calls := sums(t, reader, "tierlimit.redis.calls")[""]
	errs := sums(t, reader, "tierlimit.redis.errors")[""]
	if calls != st.RedisCalls || errs != st.RedisErrors {
		t.Errorf("redis calls, errors = %d, %d; want %d, %d (Stats)", calls, errs, st.RedisCalls, st.RedisErrors)
	}
	// hybrid hands breaker changes to the observer on a goroutine of its
	// own (no user code under its lock): the last one may still be on its
	// way when Stats counts it.
	tr := sums(t, reader, "tierlimit.breaker.transitions", AttrBreakerTo)["open"]
	for deadline := time.Now().Add(2 * time.Second); tr != st.BreakerOpens && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		tr = sums(t, reader, "tierlimit.breaker.transitions", AttrBreakerTo)["open"]
	}
	if tr != st.BreakerOpens {
		t.Errorf("breaker transitions to open = %d, want %d", tr, st.BreakerOpens)
	}
}

// TestTotalsRemote checks a remote limiter's decisions: one per call, by
// result, exactly.
func TestTotalsRemote(t *testing.T) {
	requireRedis(t)
	b, reader := newBridge(t)
	lim, err := remote.NewGCRA(redistest.Start(t).Client(t), tierlimit.PerMinute(7), remote.WithObserver(b.Observer("rem")))
	if err != nil {
		t.Fatal(err)
	}
	var allowed, denied int64
	for i := 0; i < 30; i++ {
		res, err := lim.AllowN(context.Background(), fmt.Sprint("k", i%3), 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	got := sums(t, reader, "tierlimit.rate_limiting.decisions", AttrLimiter, AttrSource, AttrResult)
	want := map[string]int64{"rem,remote,acquired": allowed, "rem,remote,rejected": denied}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("decisions{%s} = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if calls := sums(t, reader, "tierlimit.redis.calls", AttrOp)["allow"]; calls != 30 {
		t.Errorf("redis calls{op=allow} = %d, want 30", calls)
	}
}

// TestBoundedAttributes records decisions under 10,000 distinct limits:
// the limit attribute takes WithMaxLimits values and "other", and no
// decision is lost.
func TestBoundedAttributes(t *testing.T) {
	for _, max := range []int{0, 5, DefaultMaxLimits} {
		b, reader := newBridge(t, WithMaxLimits(max), WithLogger(discard()))
		o := b.Observer("tenants")
		for r := int64(1); r <= 10_000; r++ {
			o.Decision(tierlimit.Decision{Allowed: r%2 == 0, Source: tierlimit.SourceLocal, Limit: tierlimit.PerSecond(r)})
		}
		got := sums(t, reader, "tierlimit.rate_limiting.limit_decisions", AttrLimit)
		var total int64
		for _, v := range got {
			total += v
		}
		wantValues := max + 1
		if len(got) != wantValues || total != 10_000 || got["other"] != int64(10_000-max) {
			t.Errorf("WithMaxLimits(%d): %d limit values, %d decisions, %d other; want %d, 10000, %d",
				max, len(got), total, got["other"], wantValues, 10_000-max)
		}
		// Every known source and result, counted or not: 4 × 2.
		if n := len(sums(t, reader, "tierlimit.rate_limiting.decisions", AttrSource, AttrResult)); n != 8 {
			t.Errorf("decisions has %d attribute sets, want 8", n)
		}
	}
}

// TestLedgerGauges checks the hybrid instruments against Stats, and that
// the ledger balances.
func TestLedgerGauges(t *testing.T) {
	requireRedis(t)
	b, reader := newBridge(t)
	lim, err := hybrid.New(redistest.Start(t).Client(t), tierlimit.PerSecond(1000), hybrid.WithObserver(b.Observer("api")))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if err := b.WatchHybrid("api", lim); err != nil {
		t.Fatal(err)
	}
	if err := b.WatchHybrid("api", lim); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("second WatchHybrid(api) = %v, want ErrInvalidOption", err)
	}
	for i := 0; i < 500; i++ {
		if _, err := lim.AllowN(context.Background(), fmt.Sprint("k", i%7), 1); err != nil {
			t.Fatal(err)
		}
	}
	// Stats moves with background refills: read it between two
	// collections that agree.
	var st hybrid.Stats
	var got map[string]int64
	for try := 0; try < 50; try++ {
		got = ledger(t, reader)
		st = lim.Stats()
		if again := ledger(t, reader); fmt.Sprint(again) == fmt.Sprint(got) && got["leased"] == st.Leased && got["held"] == st.Held {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range []struct {
		name string
		want int64
	}{
		{"leased", st.Leased}, {"spent", st.Spent}, {"refunded", st.Refunded}, {"lost", st.Lost},
		{"held", st.Held}, {"opens", st.BreakerOpens}, {"instances", st.Instances}, {"state=closed", 1}, {"state=open", 0},
	} {
		if got[c.name] != c.want {
			t.Errorf("%s = %d, want %d (Stats)", c.name, got[c.name], c.want)
		}
	}
	if got["leased"] == 0 || got["leased"] != got["spent"]+got["refunded"]+got["lost"]+got["held"] {
		t.Errorf("ledger %v does not balance: leased = spent + refunded + lost + held", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := sums(t, reader, "tierlimit.hybrid.tokens.leased"); len(got) != 0 {
		t.Errorf("after Close: leased %v, want no points", got)
	}
}

func ledger(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	out := map[string]int64{}
	for _, n := range []string{"leased", "spent", "refunded", "lost", "held"} {
		out[n] = sums(t, reader, "tierlimit.hybrid.tokens."+n, AttrLimiter)["api"]
	}
	out["opens"] = sums(t, reader, "tierlimit.breaker.opens", AttrLimiter)["api"]
	out["instances"] = sums(t, reader, "tierlimit.hybrid.instances", AttrLimiter)["api"]
	states := sums(t, reader, "tierlimit.breaker.state", AttrBreakerState)
	out["state=closed"], out["state=open"] = states["closed"], states["open"]
	return out
}

func TestNewErrors(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	for _, tc := range []struct {
		name string
		mp   *sdkmetric.MeterProvider
		opts []Option
	}{
		{"nil provider", nil, nil},
		{"nil option", mp, []Option{nil}},
		{"negative max limits", mp, []Option{WithMaxLimits(-1)}},
		{"too many max limits", mp, []Option{WithMaxLimits(1025)}},
		{"nil logger", mp, []Option{WithLogger(nil)}},
	} {
		var err error
		if tc.mp == nil {
			_, err = New(nil, tc.opts...)
		} else {
			_, err = New(tc.mp, tc.opts...)
		}
		if !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", tc.name, err)
		}
	}
	b, _ := newBridge(t)
	if err := b.WatchHybrid("x", nil); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("WatchHybrid(nil) = %v, want ErrInvalidOption", err)
	}
}

// TestTotalsLocal: the local tier's decisions (AllowN, AllowAll, WaitN's
// tries) and whole give-backs, counted exactly, under limiter, source and
// result.
func TestTotalsLocal(t *testing.T) {
	b, reader := newBridge(t)
	lim, err := local.New(tierlimit.PerMinute(7), local.WithObserver(b.Observer("loc")))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	var allowed, denied int64
	count := func(res tierlimit.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	for i := 0; i < 30; i++ {
		count(lim.AllowN(ctx, fmt.Sprint("k", i%3), 1))
	}
	count(lim.AllowAll(ctx, tierlimit.Take{Key: "x", N: 2}, tierlimit.Take{Key: "y", N: 1}))
	count(lim.WaitN(ctx, "w", 1))
	if _, err := lim.Settle(ctx, "x", 2, 0); err != nil {
		t.Fatal(err)
	}
	got := sums(t, reader, "tierlimit.rate_limiting.decisions", AttrLimiter, AttrSource, AttrResult)
	want := map[string]int64{"loc,local,acquired": allowed, "loc,local,rejected": denied}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("decisions{%s} = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if got := sums(t, reader, "tierlimit.rate_limiting.given_back", AttrLimiter, AttrSource)["loc,local"]; got != 1 {
		t.Errorf("given_back{loc,local} = %d, want 1 (the Settle of 2 charged, 0 used)", got)
	}
	if allowed != 7*3+2 || denied != 30-7*3 {
		t.Errorf("the test's own count: %d allowed, %d denied; want %d, %d", allowed, denied, 7*3+2, 30-7*3)
	}
}
