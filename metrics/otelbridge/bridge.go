package otelbridge

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"

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

// The values of AttrResult.
const (
	ResultAcquired = "acquired"
	ResultRejected = "rejected"
)

// Bridge records what limiters do through the OpenTelemetry metric API. It
// hands out Observers (Observer) that record decisions, Redis calls and
// breaker changes as they happen, and reads the token ledger, breaker
// state and fleet size of hybrid limiters when the metrics are collected
// (WatchHybrid). Every instrument has the tierlimit.limiter attribute.
//
// From Observers:
//
//	tierlimit.rate_limiting.decisions          counter    {decision}  limiter, source, result
//	tierlimit.rate_limiting.limit_decisions    counter    {decision}  limiter, limit (at most WithMaxLimits, then "other"), result
//	tierlimit.rate_limiting.decision.duration  histogram  s           limiter, source
//	tierlimit.redis.calls                      counter    {call}      limiter, op (every call, failed or not)
//	tierlimit.redis.errors                     counter    {call}      limiter, op
//	tierlimit.redis.call.duration              histogram  s           limiter, op
//	tierlimit.breaker.transitions              counter    {transition} limiter, from, to
//	tierlimit.redis.eviction_risk              gauge      1           limiter (1 may evict, 0 cannot, -1 unknown)
//	tierlimit.redis.evicted_keys               gauge      {key}       limiter
//
// Fallback decisions are the decisions with source "fallback". From
// hybrid limiters, when collected (see hybrid.Stats; the ledger balances
// as leased = spent + refunded + lost + held):
//
//	tierlimit.hybrid.tokens.leased    counter  {token}
//	tierlimit.hybrid.tokens.spent     counter  {token}
//	tierlimit.hybrid.tokens.refunded  counter  {token}
//	tierlimit.hybrid.tokens.lost      counter  {token}
//	tierlimit.hybrid.tokens.held      gauge    {token}
//	tierlimit.breaker.state           gauge    1        limiter, state: 1 for the current state, 0 for the others
//	tierlimit.breaker.opens           counter  {open}
//	tierlimit.hybrid.instances        gauge    {instance}
//
// A Bridge is safe for concurrent use and must not be copied.
type Bridge struct {
	meter     metric.Meter
	maxLimits int
	logger    *slog.Logger

	decisions, byLimit, calls, callErrs, transitions metric.Int64Counter
	decisionLat, callLat                             metric.Float64Histogram
	evictRisk, evicted                               metric.Int64Gauge

	leased, spent, refunded, lost, opens metric.Int64ObservableCounter
	held, breaker, instances             metric.Int64ObservableGauge

	// mu guards watched; the callback reads the limiters outside it.
	mu      sync.Mutex
	watched map[string]*hybrid.Limiter
	reg     metric.Registration // nil until the first WatchHybrid
}

// New returns a Bridge recording to a Meter of mp (scope ScopeName). It
// returns an error wrapping tierlimit.ErrInvalidOption for a nil provider
// or a nil or bad option, and the error of an instrument mp cannot make.
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
	b := &Bridge{meter: m, maxLimits: cfg.maxLimits, logger: cfg.logger, watched: map[string]*hybrid.Limiter{}}
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
	obsCounter := func(name, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit("{token}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	obsGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	b.decisions = counter("tierlimit.rate_limiting.decisions", "{decision}", "Decisions made, by the tier that made them and their result.")
	b.byLimit = counter("tierlimit.rate_limiting.limit_decisions", "{decision}", "Decisions made, by the limit that decided them and their result.")
	b.decisionLat = histogram("tierlimit.rate_limiting.decision.duration", "Time from a call to its decision.", series.DecisionBuckets())
	b.calls = counter("tierlimit.redis.calls", "{call}", "Round trips to Redis (script calls and pipelines), failed or not.")
	b.callErrs = counter("tierlimit.redis.errors", "{call}", "Round trips to Redis that failed or ran out of time.")
	b.callLat = histogram("tierlimit.redis.call.duration", "Round-trip time of calls to Redis.", series.RedisBuckets())
	b.transitions = counter("tierlimit.breaker.transitions", "{transition}", "Changes of state of the circuit breaker in front of Redis.")
	b.evictRisk = gauge("tierlimit.redis.eviction_risk", "1", "1 when the Redis server may evict limiter keys, 0 when it cannot, -1 when unknown.")
	b.evicted = gauge("tierlimit.redis.evicted_keys", "{key}", "Keys the Redis server evicted since it started, as last read.")
	b.leased = obsCounter("tierlimit.hybrid.tokens.leased", "Tokens claimed from Redis into leases.")
	b.spent = obsCounter("tierlimit.hybrid.tokens.spent", "Leased tokens that admitted a request.")
	b.refunded = obsCounter("tierlimit.hybrid.tokens.refunded", "Leased tokens given back to Redis unspent.")
	b.lost = obsCounter("tierlimit.hybrid.tokens.lost", "Leased tokens that could not be refunded; never spent.")
	b.held = obsGauge("tierlimit.hybrid.tokens.held", "{token}", "Tokens in leases now.")
	b.breaker = obsGauge("tierlimit.breaker.state", "1", "State of the circuit breaker in front of Redis: 1 for the current state.")
	b.instances = obsGauge("tierlimit.hybrid.instances", "{instance}", "Live instances of the fleet, as last seen in Redis.")
	opens, err := m.Int64ObservableCounter("tierlimit.breaker.opens", metric.WithUnit("{open}"),
		metric.WithDescription("Times the circuit breaker opened."))
	b.opens = opens
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, err
	}
	return b, nil
}

// sourceCount is the number of known sources, which get their attribute
// sets made once.
const sourceCount = 4

// decisionSets are one limiter's precomputed options, so that a decision
// makes no attribute set: an allocation each (BenchmarkDecision).
type decisionSets struct {
	counts  [sourceCount][2][]metric.AddOption // [source][allowed]
	latency [sourceCount][]metric.RecordOption
}

// Observer returns an Observer that records into b under
// tierlimit.limiter=name. Pass it to a limiter's WithObserver option.
// Observers of one name share their series.
func (b *Bridge) Observer(name string) *tierlimit.Observer {
	name = strings.ToValidUTF8(name, "\uFFFD")
	lim := AttrLimiter.String(name)
	var sets decisionSets
	for s := range sourceCount {
		src := AttrSource.String(tierlimit.Source(s).String())
		sets.counts[s][0] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(lim, src, AttrResult.String(ResultRejected)))}
		sets.counts[s][1] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(lim, src, AttrResult.String(ResultAcquired)))}
		sets.latency[s] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(lim, src))}
	}
	limits := &series.Set[[2][]metric.AddOption]{
		Max: b.maxLimits,
		New: func(label string) [2][]metric.AddOption {
			l := AttrLimit.String(label)
			return [2][]metric.AddOption{
				{metric.WithAttributeSet(attribute.NewSet(lim, l, AttrResult.String(ResultRejected)))},
				{metric.WithAttributeSet(attribute.NewSet(lim, l, AttrResult.String(ResultAcquired)))},
			}
		},
	}
	limOnly := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(lim))}
	ctx := context.Background()
	return &tierlimit.Observer{
		Decision: func(d tierlimit.Decision) {
			allowed := 0
			if d.Allowed {
				allowed = 1
			}
			if int(d.Source) < sourceCount {
				b.decisions.Add(ctx, 1, sets.counts[d.Source][allowed]...)
				b.decisionLat.Record(ctx, d.Latency.Seconds(), sets.latency[d.Source]...)
			} else {
				src := AttrSource.String(d.Source.String())
				res := AttrResult.String(ResultRejected)
				if d.Allowed {
					res = AttrResult.String(ResultAcquired)
				}
				b.decisions.Add(ctx, 1, metric.WithAttributes(lim, src, res))
				b.decisionLat.Record(ctx, d.Latency.Seconds(), metric.WithAttributes(lim, src))
			}
			if d.Limit == (tierlimit.Limit{}) {
				return
			}
			opts, overflow := limits.Get(d.Limit)
			if overflow {
				logline.Or(b.logger).Warn("tierlimit: otelbridge: more distinct limits than WithMaxLimits; later ones are counted as \"other\"",
					slog.String("limiter", name), slog.Int("max_limits", b.maxLimits))
			}
			b.byLimit.Add(ctx, 1, opts[allowed]...)
		},
		RedisCall: func(rc tierlimit.RedisCall) {
			attrs := metric.WithAttributes(lim, AttrOp.String(strings.ToValidUTF8(rc.Op, "\uFFFD")))
			b.calls.Add(ctx, 1, attrs)
			if rc.Err != nil {
				b.callErrs.Add(ctx, 1, attrs)
			}
			b.callLat.Record(ctx, rc.Latency.Seconds(), attrs)
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
