package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
)

// Server is an Envoy rate-limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService): it matches each descriptor of
// a request to a rule of its Config and decides it on the rule's tier, by
// default hybrid leases. Register it on a grpc.Server with
// rls.RegisterRateLimitServiceServer (Register does, with health).
//
// A Server is safe for concurrent use; SetConfig may run while requests are
// decided. It must not be copied.
type Server struct {
	rls.UnimplementedRateLimitServiceServer

	log     *slog.Logger
	shadow  bool
	headers *HeaderNames
	metrics *serverMetrics
	tiers   *tiers

	// configs holds the config requests are matched against and the one
	// before it: a key claimed under the previous config keeps its limit
	// until its lease is done.
	configs atomic.Pointer[configPair]

	closeOnce sync.Once
	closeErr  error
}

type configPair struct{ cur, prev *Config }

// HeaderNames are the names of the response headers a Server adds (see
// WithResponseHeaders), envoyproxy/ratelimit's defaults when empty.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// The default header names, envoyproxy/ratelimit's.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// New returns a Server deciding cfg's rules with its state in the Redis behind
// rdb (a *redis.Client, a Sentinel failover client or a *redis.ClusterClient).
// It builds the hybrid and local limiters and the remote ones cfg uses;
// hybrid.New's notes apply (it waits for Redis at most about half a second,
// and starts on its fallback when Redis does not answer). Errors wrap
// tierlimit.ErrInvalidOption for a nil cfg or rdb or a bad option,
// tierlimit.ErrMisconfigured if Redis refuses the limiters' commands.
func New(cfg *Config, rdb redis.UniversalClient, opts ...Option) (*Server, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: serve: nil config", tierlimit.ErrInvalidOption)
	}
	if rdb == nil {
		return nil, fmt.Errorf("%w: serve: nil redis client", tierlimit.ErrInvalidOption)
	}
	var o options
	for _, opt := range opts {
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	s := &Server{log: o.logger, shadow: o.shadow, headers: o.headers}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.configs.Store(&configPair{cur: cfg})
	m, err := newServerMetrics(o.registerer)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	hopts := o.hybridOpts
	if m.col != nil {
		hopts = append(hopts[:len(hopts):len(hopts)], m.hybridOptions()...)
	}
	t, err := newTiers(rdb, s.limitFunc, hopts, o.localOpts, o.remoteOpts)
	if err != nil {
		return nil, err
	}
	s.tiers = t
	if err := m.watch(t.hybrid); err != nil {
		t.close()
		return nil, err
	}
	if err := t.ensure(cfg); err != nil {
		t.close()
		return nil, err
	}
	m.configLoaded(true)
	return s, nil
}

// SetConfig makes cfg the config of every request from now on, after
// building the remote limiters it needs (an error, wrapping the
// constructor's, leaves the config as it was). Keys keep their state in
// Redis: a rule whose limit changes carries its buckets over (see
// hybrid.WithLimitFunc), within one lease TTL on the hybrid tier.
func (s *Server) SetConfig(cfg *Config) error {
	if cfg == nil {
		return fmt.Errorf("%w: serve: nil config", tierlimit.ErrInvalidOption)
	}
	if err := s.tiers.ensure(cfg); err != nil {
		s.metrics.configLoaded(false)
		return err
	}
	for {
		old := s.configs.Load()
		if s.configs.CompareAndSwap(old, &configPair{cur: cfg, prev: old.cur}) {
			break
		}
	}
	s.metrics.configLoaded(true)
	return nil
}

// Config returns the config requests are matched against.
func (s *Server) Config() *Config { return s.configs.Load().cur }

// limitFunc returns the tierlimit.LimitFunc of the limiter of tier and
// algorithm a: a key's limit is its rule's, found again by matching the
// key's descriptor in the current config, else in the previous one; a key
// no rule of that limiter holds any more is blocked (no request reaches it
// through a rule).
func (s *Server) limitFunc(tier Tier, a Algorithm) tierlimit.LimitFunc {
	return func(key string) tierlimit.Limit {
		id, o, long := parseLongKey(key)
		var domain string
		var entries []Entry
		if !long {
			var ok bool
			if domain, entries, o, ok = parseKey(key); !ok {
				return tierlimit.Blocked
			}
		}
		if o != nil {
			if tier != TierHybrid {
				return tierlimit.Blocked
			}
			return o.limit()
		}
		p := s.configs.Load()
		for _, c := range [...]*Config{p.cur, p.prev} {
			if c == nil {
				continue
			}
			var r *Rule
			if long {
				r = c.byID[id]
			} else {
				r = c.Match(domain, entries)
			}
			if r != nil && !r.Unlimited && r.Tier == tier && r.Algorithm == a {
				return r.Limit
			}
		}
		return tierlimit.Blocked
	}
}

func (o *override) limit() tierlimit.Limit {
	if o.RequestsPerUnit == 0 {
		return tierlimit.Blocked
	}
	return tierlimit.Limit{Rate: int64(o.RequestsPerUnit), Period: unitPeriods[o.Unit]}
}

// ShouldRateLimit decides every descriptor of req, each apart, on its rule:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit. The overall
// code is OVER_LIMIT when a descriptor outside shadow mode is; a descriptor
// without a rule, or with an unlimited one, is OK. A descriptor's cost is
// its hits_addend when set (0 peeks: it charges nothing and reports the
// key), else the request's (0 meaning 1). It returns InvalidArgument for an
// empty domain or no descriptors, and Unavailable when a limiter cannot
// decide (a remote rule's Redis failing, a misconfigured Redis, or after
// Close), which Envoy's failure_mode_deny turns into a pass or a denial.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	s.metrics.request(req.GetDomain(), s.Config(), resp, err, time.Since(start))
	return resp, err
}

func (s *Server) shouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "serve: empty domain")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "serve: no descriptors")
	}
	rules, overrides := s.Config().rules(req.Domain, descs)
	resp := &rls.RateLimitResponse{
		OverallCode: rls.RateLimitResponse_OK,
		Statuses:    make([]*rls.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	var entries []Entry
	var key []byte
	for i, d := range descs {
		r := rules[i]
		entries = entriesOf(d, entries[:0])
		var st *rls.RateLimitResponse_DescriptorStatus
		switch {
		case r == nil:
			st = &rls.RateLimitResponse_DescriptorStatus{Code: rls.RateLimitResponse_OK}
		case r.Unlimited:
			st = &rls.RateLimitResponse_DescriptorStatus{Code: rls.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		default:
			key = appendKey(key[:0], req.Domain, entries, overrides[i])
			k := string(key)
			if len(key) > tierlimit.MaxKeyLen {
				k = longKey(key, r, overrides[i])
			}
			var err error
			st, err = s.decide(ctx, r, k, cost(req, d))
			if err != nil {
				return nil, err
			}
		}
		s.metrics.descriptor(req.Domain, r, entries, st.Code)
		if st.Code == rls.RateLimitResponse_OVER_LIMIT {
			if r.Shadow {
				st.Code = rls.RateLimitResponse_OK
			} else {
				resp.OverallCode = rls.RateLimitResponse_OVER_LIMIT
			}
		}
		resp.Statuses[i] = st
	}
	if s.headers != nil {
		resp.ResponseHeadersToAdd = s.responseHeaders(resp.Statuses)
	}
	if s.shadow {
		resp.OverallCode = rls.RateLimitResponse_OK
	}
	return resp, nil
}

// rules returns the rule of each descriptor of a request to domain, nil
// for none, after replaces: a limited rule whose name another matched
// rule replaces is dropped, as envoyproxy/ratelimit drops it (an unlimited
// one never is). A descriptor with its own limit (RateLimitDescriptor.limit,
// in a configured domain) is a hybrid token bucket of that limit, whose
// override is returned beside it.
func (c *Config) rules(domain string, descs []*rlcommon.RateLimitDescriptor) ([]*Rule, []*override) {
	rules := make([]*Rule, len(descs))
	overrides := make([]*override, len(descs))
	var replaced map[string]bool
	var entries []Entry
	for i, d := range descs {
		if ol := d.GetLimit(); ol != nil && c.domains[domain] != nil {
			if o, ok := overrideOf(ol); ok {
				overrides[i] = o
				rules[i] = &Rule{FullKey: domain + ".limit_override", Unit: o.Unit,
					RequestsPerUnit: o.RequestsPerUnit, Limit: o.limit(), Algorithm: AlgoTokenBucket, Tier: TierHybrid}
				continue
			}
		}
		entries = entriesOf(d, entries[:0])
		r := c.Match(domain, entries)
		rules[i] = r
		if r != nil && len(r.Replaces) > 0 {
			if replaced == nil {
				replaced = make(map[string]bool)
			}
			for _, name := range r.Replaces {
				replaced[name] = true
			}
		}
	}
	for i, r := range rules {
		if r != nil && !r.Unlimited && r.Name != "" && replaced[r.Name] {
			rules[i] = nil
		}
	}
	return rules, overrides
}

// decide takes n from key on r's limiter and reports it as a status; a
// status of OVER_LIMIT is before shadow mode.
func (s *Server) decide(ctx context.Context, r *Rule, key string, n int64) (*rls.RateLimitResponse_DescriptorStatus, error) {
	st := &rls.RateLimitResponse_DescriptorStatus{
		CurrentLimit: &rls.RateLimitResponse_RateLimit{
			Name:            r.Name,
			RequestsPerUnit: r.RequestsPerUnit,
			Unit:            pbUnit(r.Unit),
		},
	}
	lim := s.tiers.of(r.Tier, r.Algorithm)
	if lim == nil {
		return nil, status.Errorf(codes.Internal, "serve: no limiter for %s on %s", r.Algorithm, r.Tier)
	}
	res, err := lim.AllowN(ctx, key, n)
	switch {
	case err == nil:
	case errors.Is(err, tierlimit.ErrInvalidCost), errors.Is(err, tierlimit.ErrInvalidKey),
		errors.Is(err, tierlimit.ErrInvalidLimit):
		// A cost above the burst can never pass, and a key or limit the
		// limiter refuses must not pass either: over the limit, until the
		// end of the unit.
		st.Code = rls.RateLimitResponse_OVER_LIMIT
		st.DurationUntilReset = durationpb.New(unitPeriods[r.Unit])
		return st, nil
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	default:
		return nil, status.Errorf(codes.Unavailable, "serve: %s: %v", r.FullKey, err)
	}
	st.LimitRemaining = uint32(min(max(res.Remaining, 0), math.MaxUint32))
	if res.Allowed {
		st.Code = rls.RateLimitResponse_OK
		st.DurationUntilReset = durationpb.New(res.ResetAfter)
		return st, nil
	}
	st.Code = rls.RateLimitResponse_OVER_LIMIT
	wait := res.RetryAfter
	if wait <= 0 {
		// A blocked rule (requests_per_unit 0) promises nothing: say the
		// unit, never 0.
		wait = unitPeriods[r.Unit]
	}
	st.DurationUntilReset = durationpb.New(wait)
	return st, nil
}

// cost is a descriptor's hits_addend when set, else the request's, where 0
// means 1 (RLS v3). A negative hits_addend (is_negative_hits) charges
// nothing.
func cost(req *rls.RateLimitRequest, d *rlcommon.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		if d.GetIsNegativeHits() {
			return 0
		}
		return int64(min(h.GetValue(), tierlimit.MaxRate+1))
	}
	return int64(max(1, req.GetHitsAddend()))
}

func entriesOf(d *rlcommon.RateLimitDescriptor, buf []Entry) []Entry {
	for _, e := range d.GetEntries() {
		buf = append(buf, Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return buf
}

func fullKey(domain string, entries []Entry) string {
	b := []byte(domain)
	for _, e := range entries {
		b = append(b, '.')
		b = append(b, e.Key...)
		if e.Value != "" {
			b = append(b, '_')
			b = append(b, e.Value...)
		}
	}
	return string(b)
}

func overrideOf(o *rlcommon.RateLimitDescriptor_RateLimitOverride) (*override, bool) {
	var u Unit
	switch o.GetUnit().String() {
	case "SECOND":
		u = UnitSecond
	case "MINUTE":
		u = UnitMinute
	case "HOUR":
		u = UnitHour
	case "DAY":
		u = UnitDay
	case "WEEK":
		u = UnitWeek
	case "MONTH":
		u = UnitMonth
	case "YEAR":
		u = UnitYear
	default:
		return nil, false
	}
	return &override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u}, true
}

func pbUnit(u Unit) rls.RateLimitResponse_RateLimit_Unit {
	switch u {
	case UnitSecond:
		return rls.RateLimitResponse_RateLimit_SECOND
	case UnitMinute:
		return rls.RateLimitResponse_RateLimit_MINUTE
	case UnitHour:
		return rls.RateLimitResponse_RateLimit_HOUR
	case UnitDay:
		return rls.RateLimitResponse_RateLimit_DAY
	case UnitWeek:
		return rls.RateLimitResponse_RateLimit_WEEK
	case UnitMonth:
		return rls.RateLimitResponse_RateLimit_MONTH
	case UnitYear:
		return rls.RateLimitResponse_RateLimit_YEAR
	}
	return rls.RateLimitResponse_RateLimit_UNKNOWN
}

// responseHeaders are the headers of the most restrictive status, as
// envoyproxy/ratelimit picks it: the last descriptor over the limit, else
// the one with the fewest remaining; none when no descriptor has a limit.
func (s *Server) responseHeaders(sts []*rls.RateLimitResponse_DescriptorStatus) []*core.HeaderValue {
	var pick *rls.RateLimitResponse_DescriptorStatus
	for _, st := range sts {
		if st.CurrentLimit == nil {
			continue
		}
		over := st.Code == rls.RateLimitResponse_OVER_LIMIT
		if pick == nil || over || (pick.Code != rls.RateLimitResponse_OVER_LIMIT && st.LimitRemaining < pick.LimitRemaining) {
			pick = st
		}
	}
	if pick == nil {
		return nil
	}
	reset := pick.DurationUntilReset.AsDuration()
	return []*core.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10)},
	}
}

// Stats returns the counters of the hybrid tier's limiter (see
// hybrid.Stats): decisions by source, Redis calls, the token ledger, the
// breaker.
func (s *Server) Stats() hybrid.Stats { return s.tiers.hybrid.Stats() }

// Close gives back the tokens the hybrid tier holds (hybrid's Close) and
// stops the limiters; later requests get Unavailable. Stop serving first
// (grpc.Server's GracefulStop) so that no request is cut short. It is safe to
// call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.tiers.close()
		s.metrics.unwatch()
	})
	return s.closeErr
}
