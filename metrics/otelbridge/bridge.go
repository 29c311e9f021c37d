package otelbridge

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/logline"
	"github.com/tierlimit/tierlimit/internal/series"
)

// Attribute keys.
const (
	// AttrLimiter names the limiter: the name given to Observer or
	// WatchHybrid.
	AttrLimiter = attribute.Key("tierlimit.limiter")
	// AttrPolicy names the policy of a middleware decision (a span
	// attribute), as aspnetcore.rate_limiting.policy does.
	AttrPolicy = attribute.Key("tierlimit.rate_limiting.policy")
	// AttrResult is "acquired" or "rejected", as
	// aspnetcore.rate_limiting.result.
	AttrResult = attribute.Key("tierlimit.rate_limiting.result")
	// AttrSource is the tier that decided: local, blocked, remote or
	// fallback.
	AttrSource = attribute.Key("tierlimit.rate_limiting.source")
	// AttrRemaining is the tokens a key has left after a decision (a
	// span attribute).
	AttrRemaining = attribute.Key("tierlimit.rate_limiting.remaining")
	// AttrRetryAfter is a denial's RetryAfter in seconds (a span
	// attribute).
	AttrRetryAfter = attribute.Key("tierlimit.rate_limiting.retry_after")
	// AttrLimit is the limit that decided, e.g. "100/1s", or "other".
	AttrLimit = attribute.Key("tierlimit.rate_limiting.limit")
	// AttrOp is what a Redis call did, e.g. "allow" or "claim".
	AttrOp = attribute.Key("tierlimit.redis.op")
	// AttrBreakerState is a circuit breaker state; AttrBreakerFrom and
	// AttrBreakerTo those of a transition.
	AttrBreakerState = attribute.Key("tierlimit.breaker.state")
	AttrBreakerFrom  = attribute.Key("tierlimit.breaker.from")
	AttrBreakerTo    = attribute.Key("tierlimit.breaker.to")
)

// The values of AttrResult. A decision is acquired or rejected; a permit
// of a concurrency limiter is acquired, rejected (TryAcquire found none
// free) or gave_up (an Acquire whose ctx ended while it waited).
const (
	ResultAcquired = "acquired"
	ResultRejected = "rejected"
	ResultGaveUp   = "gave_up"
)

// Bridge records what limiters do through the OpenTelemetry metric API. It
// hands out Observers (Observer) that count decisions and record Redis
// calls and breaker changes as they happen, and reads the token ledger,
// breaker state and fleet size of hybrid limiters when the metrics are
// collected (WatchHybrid). Every instrument has the tierlimit.limiter
// attribute.
//
// From Observers:
//
//	tierlimit.rate_limiting.decisions              counter    {decision}   limiter, source, result
//	tierlimit.rate_limiting.limit_decisions        counter    {decision}   limiter, limit (at most WithMaxLimits, then "other"), result
//	tierlimit.rate_limiting.given_back             counter    {decision}   limiter, source (admissions whose charge was given back whole)
//	tierlimit.rate_limiting.decision.duration      histogram  s            limiter, source (see below)
//	tierlimit.redis.calls                          counter    {call}       limiter, op (every call, failed or not)
//	tierlimit.redis.errors                         counter    {call}       limiter, op
//	tierlimit.redis.call.duration                  histogram  s            limiter, op
//	tierlimit.breaker.transitions                  counter    {transition} limiter, from, to
//	tierlimit.redis.eviction_risk                  gauge      1            limiter (1 may evict, 0 cannot, -1 unknown)
//	tierlimit.redis.evicted_keys                   gauge      {key}        limiter
//	tierlimit.rate_limiting.permits                counter    {permit}     limiter, source, result (acquired, rejected, gave_up)
//	tierlimit.rate_limiting.permit.wait.duration   histogram  s            limiter (an Acquire that waited)
//
// The permit instruments count the acquisitions of concurrency limiters
// (given an Observer with their WithPermitObserver option) as package
// metrics counts them in tierlimit_permits_total and
// tierlimit_permit_wait_seconds, a refusal under result "rejected" (its
// "refused").
//
// Fallback decisions are the decisions with source "fallback". The two
// decision counters are counted in process and read when collected
// (asynchronous counters), so that a decision from a lease costs an atomic
// add, not a measurement (BenchmarkDecision). For the same reason the
// duration histogram records the decisions that waited on Redis (source
// remote) only, unless WithAllDurations: an in-process decision waits on
// nothing and costs a few atomic operations, less than recording its
// duration would. From
// hybrid limiters, when collected (see hybrid.Stats; the ledger balances as
// leased = spent + refunded + lost + held):
//
//	tierlimit.hybrid.tokens.leased    counter  {token}
//	tierlimit.hybrid.tokens.spent     counter  {token}
//	tierlimit.hybrid.tokens.refunded  counter  {token}
//	tierlimit.hybrid.tokens.lost      counter  {token}
//	tierlimit.hybrid.tokens.held      gauge    {token}
//	tierlimit.breaker.state           gauge    1           limiter, state: 1 for the current state, 0 for the others
//	tierlimit.breaker.opens           counter  {open}
//	tierlimit.hybrid.instances        gauge    {instance}
//
// A Bridge is safe for concurrent use and must not be copied. Close stops
// its collection callback.
type Bridge struct {
	maxLimits    int
	allDurations bool
	logger       *slog.Logger

	calls, callErrs, transitions metric.Int64Counter
	givenBack, permits           metric.Int64Counter
	decisionLat, callLat         metric.Float64Histogram
	permitWait                   metric.Float64Histogram
	evictRisk, evicted           metric.Int64Gauge

	decisions, byLimit                   metric.Int64ObservableCounter
	leased, spent, refunded, lost, opens metric.Int64ObservableCounter
	held, breaker, instances             metric.Int64ObservableGauge

	reg metric.Registration

	// mu guards named and watched; the callback reads them outside it.
	mu      sync.Mutex
	named   map[string]*limiterCounts
	watched map[string]*hybrid.Limiter
	closed  bool
}

// New returns a Bridge recording to a Meter of mp (scope ScopeName). It
// returns an error wrapping tierlimit.ErrInvalidOption for a nil provider
// or a nil or bad option, and the error of an instrument or callback mp
// cannot make.
func New(mp metric.MeterProvider, opts ...Option) (*Bridge, error) {
	if mp == nil {
		return nil, invalid("nil meter provider")
	}
	cfg := config{maxLimits: DefaultMaxLimits}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	m := mp.Meter(ScopeName)
	b := &Bridge{maxLimits: cfg.maxLimits, allDurations: cfg.allDurations, logger: cfg.logger,
		named: map[string]*limiterCounts{}, watched: map[string]*hybrid.Limiter{}}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64Gauge {
		g, err := m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	obsCounter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	obsGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	b.decisions = obsCounter("tierlimit.rate_limiting.decisions", "{decision}", "Decisions made, by the tier that made them and their result.")
	b.byLimit = obsCounter("tierlimit.rate_limiting.limit_decisions", "{decision}", "Decisions made, by the limit that decided them and their result.")
	b.givenBack = counter("tierlimit.rate_limiting.given_back", "{decision}", "Admissions whose charge was given back whole (Settle with used 0, as httplimit does for a request a later limiter refused): acquired less these is what was really admitted.")
	b.decisionLat = histogram("tierlimit.rate_limiting.decision.duration", "Time from a call to its decision.", series.DecisionBuckets())
	b.calls = counter("tierlimit.redis.calls", "{call}", "Round trips to Redis (script calls and pipelines), failed or not.")
	b.callErrs = counter("tierlimit.redis.errors", "{call}", "Round trips to Redis that failed or ran out of time.")
	b.callLat = histogram("tierlimit.redis.call.duration", "Round-trip time of calls to Redis.", series.RedisBuckets())
	b.transitions = counter("tierlimit.breaker.transitions", "{transition}", "Changes of state of the circuit breaker in front of Redis.")
	b.evictRisk = gauge("tierlimit.redis.eviction_risk", "1", "1 when the Redis server may evict limiter keys, 0 when it cannot, -1 when unknown.")
	b.evicted = gauge("tierlimit.redis.evicted_keys", "{key}", "Keys the Redis server evicted since it started, as last read.")
	b.permits = counter("tierlimit.rate_limiting.permits", "{permit}", "Acquisitions of concurrency limiters' permits, by the tier that decided and their result.")
	b.permitWait = histogram("tierlimit.rate_limiting.permit.wait.duration", "Time an Acquire of a concurrency limiter waited for a permit, when it waited.", series.DecisionBuckets())
	b.leased = obsCounter("tierlimit.hybrid.tokens.leased", "{token}", "Tokens claimed from Redis into leases.")
	b.spent = obsCounter("tierlimit.hybrid.tokens.spent", "{token}", "Leased tokens that admitted a request.")
	b.refunded = obsCounter("tierlimit.hybrid.tokens.refunded", "{token}", "Leased tokens given back to Redis unspent.")
	b.lost = obsCounter("tierlimit.hybrid.tokens.lost", "{token}", "Leased tokens that could not be refunded; never spent.")
	b.opens = obsCounter("tierlimit.breaker.opens", "{open}", "Times the circuit breaker opened.")
	b.held = obsGauge("tierlimit.hybrid.tokens.held", "{token}", "Tokens in leases now.")
	b.breaker = obsGauge("tierlimit.breaker.state", "1", "State of the circuit breaker in front of Redis: 1 for the current state.")
	b.instances = obsGauge("tierlimit.hybrid.instances", "{instance}", "Live instances of the fleet, as last seen in Redis.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	reg, err := m.RegisterCallback(b.observe, b.decisions, b.byLimit,
		b.leased, b.spent, b.refunded, b.lost, b.opens, b.held, b.breaker, b.instances)
	if err != nil {
		return nil, err
	}
	b.reg = reg
	return b, nil
}

// sourceCount is the number of known sources; a Source beyond them is
// counted as "unknown".
const sourceCount = 4

// limiterCounts are the decisions of the Observers of one name, counted
// in process and read by the collection callback.
type limiterCounts struct {
	name    string
	counts  [sourceCount + 1][2]atomic.Int64 // [source, or unknown][allowed]
	limits  series.Set[*[2]atomic.Int64]     // [allowed]
	latency [sourceCount + 1][]metric.RecordOption

	// last is the limit of the last decision and its counts: a hot key's
	// decisions skip the Set's lock and map (BenchmarkDecision).
	last atomic.Pointer[lastLimit]
}

type lastLimit struct {
	limit  tierlimit.Limit
	counts *[2]atomic.Int64
}

// limitCounts returns the counts of l.
func (lc *limiterCounts) limitCounts(l tierlimit.Limit, b *Bridge) *[2]atomic.Int64 {
	if e := lc.last.Load(); e != nil && e.limit == l {
		return e.counts
	}
	c, overflow := lc.limits.Get(l)
	if overflow {
		logline.Or(b.logger).Warn("tierlimit: otelbridge: more distinct limits than WithMaxLimits; later ones are counted as \"other\"",
			slog.String("limiter", lc.name), slog.Int("max_limits", b.maxLimits))
	}
	lc.last.Store(&lastLimit{l, c})
	return c
}

// counts returns the counts of name, made on first use.
func (b *Bridge) countsOf(name string) *limiterCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lc := b.named[name]; lc != nil {
		return lc
	}
	lc := &limiterCounts{name: name}
	lc.limits = series.Set[*[2]atomic.Int64]{Max: b.maxLimits, New: func(string) *[2]atomic.Int64 { return new([2]atomic.Int64) }}
	lim := AttrLimiter.String(name)
	for s := range lc.latency {
		lc.latency[s] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(lim, AttrSource.String(sourceName(s))))}
	}
	b.named[name] = lc
	return lc
}

// sourceName is the source attribute of counts[s].
func sourceName(s int) string {
	if s < sourceCount {
		return tierlimit.Source(s).String()
	}
	return "unknown"
}

var resultNames = [2]string{ResultRejected, ResultAcquired}

// The results of a permit, as indexes of permitResults.
const (
	permitAcquired = iota
	permitRejected
	permitGaveUp
)

var permitResults = [...]string{ResultAcquired, ResultRejected, ResultGaveUp}

// permitOptions returns the attributes of the permit counter for each
// source and result under lim, made once per Observer so that counting a
// permit allocates nothing.
func permitOptions(lim attribute.KeyValue) *[sourceCount + 1][len(permitResults)][]metric.AddOption {
	var opts [sourceCount + 1][len(permitResults)][]metric.AddOption
	for s := range opts {
		for r := range opts[s] {
			opts[s][r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(lim,
				AttrSource.String(sourceName(s)), AttrResult.String(permitResults[r])))}
		}
	}
	return &opts
}

// Observer returns an Observer that records into b under
// tierlimit.limiter=name. Pass it to a limiter's WithObserver option (to
// a concurrency limiter's WithPermitObserver for the permit instruments);
// with other Observers, such as package metrics' Collector's, through
// tierlimit.Observers. Observers of one name share their series.
func (b *Bridge) Observer(name string) *tierlimit.Observer {
	name = strings.ToValidUTF8(name, "\uFFFD")
	lc := b.countsOf(name)
	lim := AttrLimiter.String(name)
	limOnly := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(lim))}
	permitOpts := permitOptions(lim)
	ctx := context.Background()
	return &tierlimit.Observer{
		Decision: func(d tierlimit.Decision) {
			allowed := 0
			if d.Allowed {
				allowed = 1
			}
			src := min(int(d.Source), sourceCount)
			lc.counts[src][allowed].Add(1)
			if b.allDurations || d.Source == tierlimit.SourceRemote {
				b.decisionLat.Record(ctx, d.Latency.Seconds(), lc.latency[src]...)
			}
			if d.Limit == (tierlimit.Limit{}) {
				return
			}
			lc.limitCounts(d.Limit, b)[allowed].Add(1)
		},
		RedisCall: func(rc tierlimit.RedisCall) {
			attrs := metric.WithAttributes(lim, AttrOp.String(strings.ToValidUTF8(rc.Op, "\uFFFD")))
			b.calls.Add(ctx, 1, attrs)
			if rc.Err != nil {
				b.callErrs.Add(ctx, 1, attrs)
			}
			b.callLat.Record(ctx, rc.Latency.Seconds(), attrs)
		},
		GiveBack: func(g tierlimit.GiveBack) {
			b.givenBack.Add(ctx, 1, metric.WithAttributes(lim, AttrSource.String(g.Source.String())))
		},
		Permit: func(d tierlimit.PermitDecision) {
			result := permitAcquired
			switch {
			case !d.Acquired && d.Waited > 0:
				result = permitGaveUp
			case !d.Acquired:
				result = permitRejected
			}
			b.permits.Add(ctx, 1, permitOpts[min(int(d.Source), sourceCount)][result]...)
			if d.Waited > 0 {
				b.permitWait.Record(ctx, d.Waited.Seconds(), limOnly...)
			}
		},
		Breaker: func(c tierlimit.BreakerChange) {
			b.transitions.Add(ctx, 1, metric.WithAttributes(lim,
				AttrBreakerFrom.String(c.From.String()), AttrBreakerTo.String(c.To.String())))
		},
		Eviction: func(r tierlimit.EvictionRisk) {
			risk := int64(0)
			switch {
			case !r.Known():
				risk = -1
			case r.Risky():
				risk = 1
			}
			b.evictRisk.Record(ctx, risk, limOnly...)
			b.evicted.Record(ctx, r.EvictedKeys, limOnly...)
		},
	}
}
