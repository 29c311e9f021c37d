package serve

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tierlimit/tierlimit"
)

// serverConfig has limits long enough (per hour, per day) that no token
// comes back while a test runs: each step's answer is exact.
const serverConfig = `
domain: test
descriptors:
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: burst
    rate_limit: {unit: day, requests_per_unit: 2, burst: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: window
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: sliding_window}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: gcra}
  - key: own
    rate_limit: {unit: day, requests_per_unit: 2, tier: local}
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 5, name: per_user}
      - key: user
        value: vip
        rate_limit:
          unit: day
          requests_per_unit: 1
          replaces: [{name: per_user}]
`

const (
	ok   = rls.RateLimitResponse_OK
	over = rls.RateLimitResponse_OVER_LIMIT
)

// step is one request and what its answer must say: the overall code and,
// per descriptor, its code and limit_remaining (-1: not checked).
type step struct {
	req       *rls.RateLimitRequest
	overall   rls.RateLimitResponse_Code
	codes     []rls.RateLimitResponse_Code
	remaining []int64
}

func runSteps(t *testing.T, c rls.RateLimitServiceClient, steps []step) {
	t.Helper()
	ctx := testCtx(t)
	for i, st := range steps {
		resp, err := c.ShouldRateLimit(ctx, st.req)
		if err != nil {
			t.Fatalf("step %d: ShouldRateLimit: %v", i, err)
		}
		if resp.OverallCode != st.overall {
			t.Errorf("step %d: overall_code = %v, want %v (%v)", i, resp.OverallCode, st.overall, resp)
		}
		if len(resp.Statuses) != len(st.req.Descriptors) {
			t.Fatalf("step %d: %d statuses for %d descriptors", i, len(resp.Statuses), len(st.req.Descriptors))
		}
		for j, ds := range resp.Statuses {
			if j < len(st.codes) && ds.Code != st.codes[j] {
				t.Errorf("step %d: statuses[%d].code = %v, want %v", i, j, ds.Code, st.codes[j])
			}
			if j < len(st.remaining) && st.remaining[j] >= 0 && int64(ds.LimitRemaining) != st.remaining[j] {
				t.Errorf("step %d: statuses[%d].limit_remaining = %d, want %d", i, j, ds.LimitRemaining, st.remaining[j])
			}
		}
	}
}

func hits(n uint64, d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func TestShouldRateLimit(t *testing.T) {
	one := func(code rls.RateLimitResponse_Code, remaining int64, kv ...string) step {
		return step{req: request("test", desc(kv...)), overall: code,
			codes: []rls.RateLimitResponse_Code{code}, remaining: []int64{remaining}}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"hybrid token bucket", []step{
			one(ok, 2, "hourly", "a"), one(ok, 1, "hourly", "a"), one(ok, 0, "hourly", "a"),
			one(over, 0, "hourly", "a"), one(over, 0, "hourly", "a"),
		}},
		{"a key without value counts each value apart", []step{
			one(ok, 2, "hourly", "x"), one(ok, 2, "hourly", "y"), one(ok, 1, "hourly", "x"),
		}},
		{"burst", []step{
			one(ok, 3, "burst", "a"), one(ok, 2, "burst", "a"), one(ok, 1, "burst", "a"),
			one(ok, 0, "burst", "a"), one(over, 0, "burst", "a"),
		}},
		{"no rule", []step{one(ok, 0, "nope", "a"), one(ok, 0, "hourly", "a", "extra", "b")}},
		{"unknown domain", []step{{req: request("elsewhere", desc("hourly", "a")), overall: ok,
			codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{0}}}},
		{"unlimited", []step{one(ok, math.MaxUint32, "free", "a"), one(ok, math.MaxUint32, "free", "a")}},
		{"shadow mode", []step{one(ok, 0, "shadow", "a"), one(ok, 0, "shadow", "a")}},
		{"blocked", []step{one(over, 0, "blocked", "a")}},
		{"remote fixed window", []step{one(ok, 1, "window", "a"), one(ok, 0, "window", "a"), one(over, 0, "window", "a")}},
		{"remote sliding window", []step{one(ok, 1, "sliding", "a"), one(ok, 0, "sliding", "a"), one(over, 0, "sliding", "a")}},
		{"remote gcra", []step{one(ok, 1, "gcra", "a"), one(ok, 0, "gcra", "a"), one(over, 0, "gcra", "a")}},
		{"local", []step{one(ok, 1, "own", "a"), one(ok, 0, "own", "a"), one(over, 0, "own", "a")}},
		{"request hits_addend", []step{
			{req: &rls.RateLimitRequest{Domain: "test", HitsAddend: 2, Descriptors: []*rlcommon.RateLimitDescriptor{desc("hourly", "h")}},
				overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{1}},
			{req: &rls.RateLimitRequest{Domain: "test", HitsAddend: 2, Descriptors: []*rlcommon.RateLimitDescriptor{desc("hourly", "h")}},
				overall: over, codes: []rls.RateLimitResponse_Code{over}, remaining: []int64{-1}},
			one(ok, 0, "hourly", "h"),
		}},
		{"descriptor hits_addend: 0 peeks, above the burst is over", []step{
			one(ok, 2, "hourly", "p"),
			{req: request("test", hits(0, desc("hourly", "p"))), overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{2}},
			{req: request("test", hits(0, desc("hourly", "p"))), overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{2}},
			{req: request("test", hits(4, desc("hourly", "p"))), overall: over, codes: []rls.RateLimitResponse_Code{over}, remaining: []int64{0}},
			{req: request("test", hits(2, desc("hourly", "p"))), overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{0}},
		}},
		{"several descriptors, each decided apart", []step{
			{req: request("test", desc("hourly", "m"), desc("blocked", "m"), desc("free", "m")), overall: over,
				codes: []rls.RateLimitResponse_Code{ok, over, ok}, remaining: []int64{2, 0, math.MaxUint32}},
			{req: request("test", desc("hourly", "m"), desc("shadow", "m"), desc("shadow", "m")), overall: ok,
				codes: []rls.RateLimitResponse_Code{ok, ok, ok}, remaining: []int64{1, 0, 0}},
		}},
		{"replaces", []step{
			{req: request("test", desc("org", "o", "user", "vip"), desc("org", "o", "user", "bob")), overall: ok,
				codes: []rls.RateLimitResponse_Code{ok, ok}, remaining: []int64{0, 0}},
			{req: request("test", desc("org", "o", "user", "vip"), desc("org", "o", "user", "bob")), overall: over,
				codes: []rls.RateLimitResponse_Code{over, ok}, remaining: []int64{0, 0}},
			one(ok, 4, "org", "o", "user", "bob"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, serverConfig, mini(t))
			runSteps(t, srv.client, tc.steps)
		})
	}
}

func TestStatusFields(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	ctx := testCtx(t)
	resp, err := srv.client.ShouldRateLimit(ctx, request("test", desc("org", "o", "user", "bob"), desc("nope", "x")))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Statuses[0]
	want := &rls.RateLimitResponse_RateLimit{Name: "per_user", RequestsPerUnit: 5, Unit: rls.RateLimitResponse_RateLimit_DAY}
	if st.CurrentLimit.GetName() != want.Name || st.CurrentLimit.GetRequestsPerUnit() != want.RequestsPerUnit || st.CurrentLimit.GetUnit() != want.Unit {
		t.Errorf("current_limit = %v, want %v", st.CurrentLimit, want)
	}
	// A token bucket refills one token per unit/rate: full again after
	// one token's time.
	if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > 24*time.Hour/5 {
		t.Errorf("duration_until_reset = %v, want in (0, %v]", d, 24*time.Hour/5)
	}
	if resp.Statuses[1].CurrentLimit != nil || resp.Statuses[1].DurationUntilReset != nil {
		t.Errorf("status without a rule = %v, want no limit and no duration", resp.Statuses[1])
	}
	for range 2 {
		if _, err := srv.client.ShouldRateLimit(ctx, request("test", desc("hourly", "d"))); err != nil {
			t.Fatal(err)
		}
	}
	resp, err = srv.client.ShouldRateLimit(ctx, request("test", desc("hourly", "d"), desc("hourly", "d")))
	if err != nil {
		t.Fatal(err)
	}
	// Denied: the wait for one token, 20 minutes at 3 per hour.
	if d := resp.Statuses[1].DurationUntilReset.AsDuration(); d <= 0 || d > 20*time.Minute {
		t.Errorf("denied duration_until_reset = %v, want in (0, 20m]", d)
	}
	resp, err = srv.client.ShouldRateLimit(ctx, request("test", desc("blocked", "b")))
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Statuses[0].DurationUntilReset.AsDuration(); d != time.Minute {
		t.Errorf("blocked duration_until_reset = %v, want the unit, 1m", d)
	}
}

func TestResponseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names HeaderNames
		req   *rls.RateLimitRequest
		want  []string // key=value
	}{
		{"fewest remaining", HeaderNames{}, request("test", desc("hourly", "a"), desc("burst", "a")),
			[]string{"RateLimit-Limit=3", "RateLimit-Remaining=2", "RateLimit-Reset=1200"}},
		{"over the limit wins", HeaderNames{Remaining: "X-Left"}, request("test", desc("burst", "b"), desc("blocked", "b")),
			[]string{"RateLimit-Limit=0", "X-Left=0", "RateLimit-Reset=60"}},
		{"no limit, no headers", HeaderNames{}, request("test", desc("nope", "c"), desc("free", "c")), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, serverConfig, mini(t), WithResponseHeaders(tc.names))
			resp, err := srv.client.ShouldRateLimit(testCtx(t), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := headerList(resp.ResponseHeadersToAdd); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("response_headers_to_add = %v, want %v", got, tc.want)
			}
		})
	}
	srv := newServer(t, serverConfig, mini(t))
	resp, err := srv.client.ShouldRateLimit(testCtx(t), request("test", desc("hourly", "a")))
	if err != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("without WithResponseHeaders: %v, %v; want no headers", resp.GetResponseHeadersToAdd(), err)
	}
}

func headerList(hs []*core.HeaderValue) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key+"="+h.Value)
	}
	return out
}

func TestGlobalShadowMode(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t), WithShadowMode())
	runSteps(t, srv.client, []step{{req: request("test", desc("blocked", "a")), overall: ok,
		codes: []rls.RateLimitResponse_Code{over}, remaining: []int64{0}}})
}

func TestOverride(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	d := func() *rlcommon.RateLimitDescriptor {
		d := desc("nope", "o")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
		return d
	}
	runSteps(t, srv.client, []step{
		{req: request("test", d()), overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{0}},
		{req: request("test", d()), overall: over, codes: []rls.RateLimitResponse_Code{over}, remaining: []int64{0}},
		// The configured rule of the same descriptor is another bucket.
		{req: request("test", desc("hourly", "o")), overall: ok, codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{2}},
	})
}

func TestInvalidRequests(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	ctx := testCtx(t)
	for _, req := range []*rls.RateLimitRequest{
		{Descriptors: []*rlcommon.RateLimitDescriptor{desc("hourly", "a")}},
		{Domain: "test"},
	} {
		if _, err := srv.client.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ShouldRateLimit(%v) = %v, want InvalidArgument", req, err)
		}
	}
}

// TestLongDescriptor checks that a descriptor whose key is longer than the
// limiters take (a long header value) is decided like any other, each
// value apart, on every tier and with an override.
func TestLongDescriptor(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	long := strings.Repeat("x", tierlimit.MaxKeyLen)
	over1 := func(kv ...string) *rlcommon.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
		return d
	}
	one := func(code rls.RateLimitResponse_Code, remaining int64, d *rlcommon.RateLimitDescriptor) step {
		return step{req: request("test", d), overall: code, codes: []rls.RateLimitResponse_Code{code}, remaining: []int64{remaining}}
	}
	runSteps(t, srv.client, []step{
		one(ok, 2, desc("hourly", long+"a")), one(ok, 1, desc("hourly", long+"a")),
		one(ok, 2, desc("hourly", long+"b")),
		one(ok, 0, desc("hourly", long+"a")), one(over, 0, desc("hourly", long+"a")),
		one(ok, 1, desc("window", long)), one(ok, 0, desc("window", long)), one(over, 0, desc("window", long)),
		one(ok, 0, over1("nope", long)), one(over, 0, over1("nope", long)),
	})
}

func TestClose(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	ctx := testCtx(t)
	if _, err := srv.client.ShouldRateLimit(ctx, request("test", desc("hourly", "a"))); err != nil {
		t.Fatal(err)
	}
	if err := srv.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := srv.s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := srv.client.ShouldRateLimit(ctx, request("test", desc("hourly", "a"))); status.Code(err) != codes.Unavailable {
		t.Errorf("after Close: %v, want Unavailable", err)
	}
	// No rule, no limiter: still answered.
	if _, err := srv.client.ShouldRateLimit(ctx, request("test", desc("nope", "a"))); err != nil {
		t.Errorf("after Close, no rule: %v, want OK", err)
	}
}

func TestHealth(t *testing.T) {
	srv := newServer(t, serverConfig, mini(t))
	ctx := testCtx(t)
	hc := healthpb.NewHealthClient(srv.conn)
	for _, svc := range []string{"", ServiceName} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	srv.health.Shutdown()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Check after Shutdown = %v, %v; want NOT_SERVING", resp, err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	srv := newServer(t, serverConfig, mini(t), WithRegisterer(reg))
	runSteps(t, srv.client, []step{
		{req: request("test", desc("hourly", "a"), desc("free", "a"), desc("nope", "a")), overall: ok},
		{req: request("test", desc("blocked", "a"), desc("shadow", "a"), desc("shadow", "a")), overall: over},
		{req: request("elsewhere", desc("hourly", "a")), overall: ok},
	})
	for _, tc := range []struct {
		c      prometheus.Collector
		labels []string
		want   float64
	}{
		{srv.s.metrics.requests, []string{"test", "ok"}, 1},
		{srv.s.metrics.requests, []string{"test", "over_limit"}, 1},
		{srv.s.metrics.requests, []string{"unknown", "ok"}, 1},
		{srv.s.metrics.descriptors, []string{"test.hourly", "ok"}, 1},
		{srv.s.metrics.descriptors, []string{"test.free", "unlimited"}, 1},
		{srv.s.metrics.descriptors, []string{"none", "ok"}, 2},
		{srv.s.metrics.descriptors, []string{"test.blocked", "over_limit"}, 1},
		{srv.s.metrics.descriptors, []string{"test.shadow", "ok"}, 1},
		{srv.s.metrics.descriptors, []string{"test.shadow", "shadow_over_limit"}, 1},
		{srv.s.metrics.loads, []string{"success"}, 1},
	} {
		vec := tc.c.(*prometheus.CounterVec)
		if got := testutil.ToFloat64(vec.WithLabelValues(tc.labels...)); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.labels, got, tc.want)
		}
	}
	// The hybrid limiter's own series are registered too.
	n, err := testutil.GatherAndCount(reg, "tierlimit_decisions_total", "tierlimit_hybrid_tokens_leased_total")
	if err != nil || n == 0 {
		t.Errorf("hybrid series: %d, %v; want some", n, err)
	}
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", probs, err)
	}
	srv.s.Close()
	// Close unregisters: a new server may register on the same registry.
	srv2 := newServer(t, serverConfig, mini(t), WithRegisterer(reg))
	srv2.s.Close()
}

func TestDetailedMetricBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := newServer(t, "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1}",
		mini(t), WithRegisterer(reg))
	m := srv.s.metrics
	r := srv.s.Config().Match("d", entries("k", "x"))
	for i := range maxDetailed + 10 {
		m.descriptor("d", r, entries("k", string(rune('a'+i%26))+strings.Repeat("z", i)), ok)
	}
	if n := testutil.CollectAndCount(m.descriptors); n != maxDetailed+1 {
		t.Errorf("%d series, want %d detailed and the rule's", n, maxDetailed+1)
	}
	if got := testutil.ToFloat64(m.descriptors.WithLabelValues("d.k", "ok")); got != 10 {
		t.Errorf("decisions past the bound = %v, want 10 under the rule's key", got)
	}
}

func TestNewErrors(t *testing.T) {
	cfg := mustParse(t, serverConfig)
	for _, tc := range []struct {
		name string
		cfg  *Config
		opts []Option
	}{
		{"nil config", nil, nil},
		{"nil logger", cfg, []Option{WithLogger(nil)}},
		{"nil registerer", cfg, []Option{WithRegisterer(nil)}},
	} {
		if _, err := New(tc.cfg, mini(t), tc.opts...); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", tc.name, err)
		}
	}
	if _, err := New(cfg, nil); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("nil client: New = %v, want ErrInvalidOption", err)
	}
}

// logBuffer returns a logger that writes into the returned buffer.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

// TestReplacesKeepsUnlimited checks that an unlimited rule is never
// replaced, and that its replaces apply, as in envoyproxy/ratelimit.
func TestReplacesKeepsUnlimited(t *testing.T) {
	srv := newServer(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unlimited: true, name: free, replaces: [{name: capped}]}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 0, name: capped, replaces: [{name: free}]}
`, mini(t))
	runSteps(t, srv.client, []step{{req: request("d", desc("a", "x"), desc("b", "x")), overall: ok,
		codes: []rls.RateLimitResponse_Code{ok, ok}, remaining: []int64{math.MaxUint32, 0}}})
}
