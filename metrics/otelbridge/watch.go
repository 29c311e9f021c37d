package otelbridge

import (
	"context"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
)

// WatchHybrid records l's token ledger, breaker state and fleet size under
// tierlimit.limiter=name, read from l.Stats each time the metrics are
// collected. Its decisions and Redis calls come from an Observer
// (hybrid.WithObserver(b.Observer(name))). It returns an error wrapping
// tierlimit.ErrInvalidOption for a nil limiter or a name already watched.
func (b *Bridge) WatchHybrid(name string, l *hybrid.Limiter) error {
	if l == nil {
		return invalid("nil hybrid limiter %q", name)
	}
	name = strings.ToValidUTF8(name, "\uFFFD")
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watched[name] != nil {
		return invalid("hybrid limiter %q is already watched", name)
	}
	b.watched[name] = l
	return nil
}

// Close stops the collection callback: the decision counters and the
// hybrid limiters are no longer read. It is safe to call twice.
func (b *Bridge) Close() error {
	b.mu.Lock()
	closed := b.closed
	b.closed = true
	b.mu.Unlock()
	if closed {
		return nil
	}
	return b.reg.Unregister()
}

var breakerStates = []tierlimit.BreakerState{tierlimit.BreakerClosed, tierlimit.BreakerHalfOpen, tierlimit.BreakerOpen}

// observe is the collection callback: it reads the decision counts and
// the hybrid limiters, outside b.mu.
func (b *Bridge) observe(_ context.Context, o metric.Observer) error {
	b.mu.Lock()
	named := make([]*limiterCounts, 0, len(b.named))
	for _, lc := range b.named {
		named = append(named, lc)
	}
	watched := make(map[string]*hybrid.Limiter, len(b.watched))
	for n, l := range b.watched {
		watched[n] = l
	}
	b.mu.Unlock()
	for _, lc := range named {
		lim := AttrLimiter.String(lc.name)
		for s := range lc.counts {
			for a := range lc.counts[s] {
				if v := lc.counts[s][a].Load(); v != 0 || s < sourceCount {
					o.ObserveInt64(b.decisions, v, metric.WithAttributes(lim,
						AttrSource.String(sourceName(s)), AttrResult.String(resultNames[a])))
				}
			}
		}
		lc.limits.Range(func(label string, c *[2]atomic.Int64) {
			for a := range c {
				o.ObserveInt64(b.byLimit, c[a].Load(), metric.WithAttributes(lim,
					AttrLimit.String(label), AttrResult.String(resultNames[a])))
			}
		})
	}
	for name, l := range watched {
		s := l.Stats()
		lim := metric.WithAttributes(AttrLimiter.String(name))
		o.ObserveInt64(b.leased, s.Leased, lim)
		o.ObserveInt64(b.spent, s.Spent, lim)
		o.ObserveInt64(b.refunded, s.Refunded, lim)
		o.ObserveInt64(b.lost, s.Lost, lim)
		o.ObserveInt64(b.held, s.Held, lim)
		o.ObserveInt64(b.opens, s.BreakerOpens, lim)
		o.ObserveInt64(b.instances, s.Instances, lim)
		for _, st := range breakerStates {
			v := int64(0)
			if s.Breaker == st {
				v = 1
			}
			o.ObserveInt64(b.breaker, v, metric.WithAttributes(AttrLimiter.String(name), AttrBreakerState.String(st.String())))
		}
	}
	return nil
}

// SpanDecision sets a limiter's decision about a call as attributes of the
// call's span, when one is recording: the policy, the result, the source,
// the remaining tokens and, denied, the RetryAfter in seconds. Give it to
// httplimit.WithDecisionFunc or grpclimit.WithDecisionFunc: they tell the
// decisions of the limiters in order up to the first denial, so that the
// span ends up with the denying limiter's, or the last one's when all
// admitted. It costs nothing more than the span lookup when no span
// records.
func SpanDecision(ctx context.Context, policy string, res tierlimit.Result) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	result := ResultAcquired
	if !res.Allowed {
		result = ResultRejected
	}
	attrs := []attribute.KeyValue{
		AttrPolicy.String(policy),
		AttrResult.String(result),
		AttrSource.String(res.Source.String()),
		AttrRemaining.Int64(res.Remaining),
	}
	if !res.Allowed {
		attrs = append(attrs, AttrRetryAfter.Float64(res.RetryAfter.Seconds()))
	}
	span.SetAttributes(attrs...)
}
