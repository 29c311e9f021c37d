package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// conformanceConfig is in envoyproxy/ratelimit's format; ALGO is replaced
// by nothing for the reference and for our default (a hybrid token
// bucket), and by our fixed window for the third run. Every unit is an
// hour or a day, so that no window ends, and no token comes back, while a
// scenario runs (TestConformance checks the hour did not turn).
const conformanceConfig = `
domain: conf
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3 ALGO}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unlimited: true}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2 ALGO}
  - key: database
    value: users
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 2, name: per_user ALGO}
      - key: user
        value: vip
        rate_limit:
          unit: day
          requests_per_unit: 1
          replaces: [{name: per_user}]
          WINDOWLINE
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1 ALGO}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0 ALGO}
`

func configFor(algo string) string {
	if algo == "" {
		return strings.NewReplacer(" ALGO", "", "WINDOWLINE", "").Replace(conformanceConfig)
	}
	return strings.NewReplacer(" ALGO", ", algorithm: "+algo, "WINDOWLINE", "algorithm: "+algo).Replace(conformanceConfig)
}

// scenario is a sequence of requests; diff explains the steps where our
// codes may differ from the reference's, by the algorithm.
type scenario struct {
	name string
	reqs []*rls.RateLimitRequest
	diff map[int]string
}

func d(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func req(descs ...*rlcommon.RateLimitDescriptor) *rls.RateLimitRequest {
	return &rls.RateLimitRequest{Domain: "conf", Descriptors: descs}
}

func repeat(n int, r func() *rls.RateLimitRequest) []*rls.RateLimitRequest {
	var out []*rls.RateLimitRequest
	for range n {
		out = append(out, r())
	}
	return out
}

// scenarios builds the scenarios with values unique to run, so that runs
// on one Redis do not share counters.
func scenarios(run string) []scenario {
	ip := func(s string) *rlcommon.RateLimitDescriptor { return d("remote_address", run+s) }
	hits := func(n uint32, ds ...*rlcommon.RateLimitDescriptor) *rls.RateLimitRequest {
		r := req(ds...)
		r.HitsAddend = n
		return r
	}
	descHits := func(n uint64, x *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
		x.HitsAddend = wrapperspb.UInt64(n)
		return x
	}
	return []scenario{
		{name: "a key without value: each value its own limit", reqs: append(
			repeat(5, func() *rls.RateLimitRequest { return req(ip("a")) }),
			req(ip("b")), req(ip("b")), req(ip("a")))},
		{name: "a value beats the key alone (unlimited)", reqs: repeat(5, func() *rls.RateLimitRequest { return req(d("remote_address", "10.0.0.1")) })},
		{name: "wildcard value", reqs: append(
			repeat(3, func() *rls.RateLimitRequest { return req(d("path", "/api/"+run)) }),
			req(d("path", "/web/"+run)))},
		{name: "nested, deeper and shallower descriptors", reqs: append(
			repeat(3, func() *rls.RateLimitRequest { return req(d("database", "users", "user", run+"alice")) }),
			req(d("database", "users")),
			req(d("database", "users", "user", run+"alice", "extra", "x")),
			req(d("database", "other", "user", run+"alice")))},
		{name: "replaces", reqs: repeat(3, func() *rls.RateLimitRequest {
			return req(d("database", "users", "user", "vip"), d("database", "users", "user", run+"bob"))
		})},
		{name: "shadow mode", reqs: repeat(3, func() *rls.RateLimitRequest { return req(d("shadow", run)) })},
		{name: "requests_per_unit 0", reqs: repeat(2, func() *rls.RateLimitRequest { return req(d("closed", run)) })},
		{name: "unknown domain and no rule", reqs: []*rls.RateLimitRequest{
			{Domain: "nowhere", Descriptors: []*rlcommon.RateLimitDescriptor{ip("c")}},
			req(d("nokey", run)),
		}},
		{name: "several descriptors, each decided apart", reqs: repeat(4, func() *rls.RateLimitRequest {
			return req(ip("m1"), ip("m2"), d("remote_address", "10.0.0.1"))
		})},
		{name: "request hits_addend", reqs: []*rls.RateLimitRequest{
			hits(2, ip("h")), hits(2, ip("h")), hits(1, ip("h")),
		}, diff: map[int]string{
			2: "the reference counts the denied 2 hits (INCRBY always), so 1 more is over; ours never charges a denial: 1 token is left",
		}},
		{name: "descriptor hits_addend, 0 peeks", reqs: []*rls.RateLimitRequest{
			req(descHits(0, ip("p"))), req(descHits(3, ip("p"))), req(descHits(0, ip("p"))), req(ip("p")),
		}},
	}
}

type outcome struct {
	overall   rls.RateLimitResponse_Code
	codes     []rls.RateLimitResponse_Code
	remaining []uint32
	reset     []time.Duration
}

func (o outcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", o.overall)
	for i := range o.codes {
		fmt.Fprintf(&b, " [%v rem=%d reset=%v]", o.codes[i], o.remaining[i], o.reset[i].Round(time.Second))
	}
	return b.String()
}

func play(t *testing.T, c rls.RateLimitServiceClient, reqs []*rls.RateLimitRequest) []outcome {
	t.Helper()
	var out []outcome
	for i, r := range reqs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.ShouldRateLimit(ctx, r)
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		o := outcome{overall: resp.OverallCode}
		for _, st := range resp.Statuses {
			o.codes = append(o.codes, st.Code)
			o.remaining = append(o.remaining, st.LimitRemaining)
			o.reset = append(o.reset, st.DurationUntilReset.AsDuration())
		}
		out = append(out, o)
	}
	return out
}

func sameCodes(a, b outcome) bool {
	if a.overall != b.overall || len(a.codes) != len(b.codes) {
		return false
	}
	for i := range a.codes {
		if a.codes[i] != b.codes[i] {
			return false
		}
	}
	return true
}

// TestConformance sends the same scenarios, one request at a time, with a
// real gRPC client over TCP, to envoyproxy/ratelimit and to tierlimit-serve
// (its default hybrid token bucket, and its remote fixed window), all three
// on one redis-server, and requires the same codes at every step but those
// a scenario explains by the algorithm. limit_remaining and
// duration_until_reset are logged side by side.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("builds envoyproxy/ratelimit")
	}
	refBin, oursBin := binaries(t)
	rs := redisServer(t)
	servers := []struct {
		name string
		c    rls.RateLimitServiceClient
	}{
		{"reference", dial(t, startRef(t, refBin, rs.Addr, configFor("")).addr)},
		{"ours (hybrid token bucket)", dial(t, startOurs(t, oursBin, rs.Addr, configFor("")).addr)},
		{"ours (fixed_window)", dial(t, startOurs(t, oursBin, rs.Addr, configFor("fixed_window")).addr)},
	}
	for attempt := 0; ; attempt++ {
		hour := time.Now().Truncate(time.Hour)
		run := fmt.Sprintf("r%d-%d-", time.Now().UnixNano(), attempt)
		failed := false
		for _, sc := range scenarios(run) {
			results := make([][]outcome, len(servers))
			for i, s := range servers {
				results[i] = play(t, s.c, sc.reqs)
			}
			if time.Now().Truncate(time.Hour) != hour {
				break // a window ended mid-run: run again on fresh keys
			}
			for step := range sc.reqs {
				ref := results[0][step]
				for i := 1; i < len(servers); i++ {
					got := results[i][step]
					why, explained := sc.diff[step]
					switch {
					case sameCodes(ref, got):
						t.Logf("%s, step %d, %s: %v | reference: %v", sc.name, step, servers[i].name, got, ref)
					case explained:
						t.Logf("%s, step %d, %s: %v | reference: %v — differs: %s", sc.name, step, servers[i].name, got, ref, why)
					default:
						failed = true
						t.Errorf("%s, step %d, %s: %v | reference: %v — codes differ", sc.name, step, servers[i].name, got, ref)
					}
				}
			}
		}
		if time.Now().Truncate(time.Hour) == hour || failed || attempt == 1 {
			return
		}
	}
}
