package metrics

import (
	"log/slog"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
)

// Collector is a prometheus.Collector of tierlimit metrics. It counts what
// the limiters tell the Observers it hands out (Observer), and reads the
// counters of hybrid limiters when scraped (WatchHybrid). Register it with
// a prometheus.Registerer. Every metric has a limiter label, the name given
// to Observer or WatchHybrid.
//
// From Observers:
//
//	tierlimit_decisions_total{limiter,source,result}         counter    result: allowed, denied, given_back
//	tierlimit_limit_decisions_total{limiter,limit,result}    counter    limit: the deciding Limit's String, at most WithMaxLimits of them, then "other"
//	tierlimit_decision_duration_seconds{limiter,source}      histogram
//	tierlimit_redis_calls_total{limiter,op}                  counter    every call, failed or not
//	tierlimit_redis_errors_total{limiter,op}                 counter
//	tierlimit_redis_call_duration_seconds{limiter,op}        histogram
//	tierlimit_breaker_transitions_total{limiter,from,to}     counter
//	tierlimit_redis_eviction_risk{limiter}                   gauge      1: Redis may evict limiter keys; 0: it cannot; -1: unknown
//	tierlimit_redis_evicted_keys{limiter}                    gauge      keys the server evicted since it started, last read
//	tierlimit_permits_total{limiter,source,result}           counter    concurrency limiters' acquisitions; result: acquired, refused, gave_up (an Acquire whose ctx ended)
//	tierlimit_permit_wait_seconds{limiter}                   histogram  how long an Acquire waited, when it did (decision buckets)
//
// From hybrid limiters, at scrape time (see hybrid.Stats; the ledger
// balances as leased = spent + refunded + lost + held):
//
//	tierlimit_hybrid_tokens_leased_total{limiter}            counter
//	tierlimit_hybrid_tokens_spent_total{limiter}             counter
//	tierlimit_hybrid_tokens_refunded_total{limiter}          counter
//	tierlimit_hybrid_tokens_lost_total{limiter}              counter
//	tierlimit_hybrid_tokens_held{limiter}                    gauge
//	tierlimit_breaker_state{limiter,state}                   gauge      1 for the current state, 0 for the others
//	tierlimit_breaker_opens_total{limiter}                   counter
//	tierlimit_hybrid_instances{limiter}                      gauge      live instances of the fleet
//
// result "allowed" counts every admission when it is decided, and
// "given_back" the admissions whose whole charge was given back later
// (tierlimit.Observer.GiveBack: a Settle of used 0, such as httplimit's
// give-back of what earlier limiters charged a request a later one
// refused): the admissions that stood are allowed − given_back.
//
// A Collector is safe for concurrent use and must not be copied.
type Collector struct {
	decisions   *prometheus.CounterVec
	byLimit     *prometheus.CounterVec
	maxLimits   int
	logger      *slog.Logger
	decisionLat *prometheus.HistogramVec
	calls       *prometheus.CounterVec
	callErrs    *prometheus.CounterVec
	callLat     *prometheus.HistogramVec
	transitions *prometheus.CounterVec
	evictRisk   *prometheus.GaugeVec
	evicted     *prometheus.GaugeVec
	permits     *prometheus.CounterVec
	permitWait  *prometheus.HistogramVec

	leased, spent, refunded, lost, held *prometheus.Desc
	breaker, opens, instances           *prometheus.Desc

	// mu guards watched; Collect reads the limiters outside it.
	mu      sync.Mutex
	watched []watch
}

// watch is a hybrid limiter read at scrape time.
type watch struct {
	name string
	lim  *hybrid.Limiter
}

// New returns a Collector. It returns an error wrapping
// tierlimit.ErrInvalidOption for a nil or bad option.
func New(opts ...Option) (*Collector, error) {
	cfg := defaults()
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	ns := cfg.namespace
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, append([]string{"limiter"}, labels...), nil)
	}
	return &Collector{
		decisions: counter("decisions_total", "Decisions made, by the tier that made them and their result.",
			"limiter", "source", "result"),
		byLimit: counter("limit_decisions_total", "Decisions made, by the limit that decided them (a key's own, with per-key limits) and their result.",
			"limiter", "limit", "result"),
		maxLimits: cfg.maxLimits,
		logger:    cfg.logger,
		decisionLat: histogram("decision_duration_seconds", "Time from a call to its decision.",
			cfg.decisionBuckets, "limiter", "source"),
		calls:    counter("redis_calls_total", "Round trips to Redis (script calls and pipelines), failed or not.", "limiter", "op"),
		callErrs: counter("redis_errors_total", "Round trips to Redis that failed or ran out of time.", "limiter", "op"),
		callLat: histogram("redis_call_duration_seconds", "Round-trip time of calls to Redis.",
			cfg.redisBuckets, "limiter", "op"),
		transitions: counter("breaker_transitions_total", "Changes of state of the circuit breaker in front of Redis.",
			"limiter", "from", "to"),
		evictRisk: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "redis_eviction_risk",
			Help: "1 when the Redis server may evict limiter keys (maxmemory with a policy other than noeviction), 0 when it cannot, -1 when unknown."},
			[]string{"limiter"}),
		evicted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "redis_evicted_keys",
			Help: "Keys the Redis server evicted since it started, as last read."}, []string{"limiter"}),
		permits: counter("permits_total", "Acquisitions of concurrency limiters' permits, by the tier that decided and their result.",
			"limiter", "source", "result"),
		permitWait: histogram("permit_wait_seconds", "Time an Acquire of a concurrency limiter waited for a permit, when it waited.",
			cfg.decisionBuckets, "limiter"),

		leased:    desc("hybrid_tokens_leased_total", "Tokens claimed from Redis into leases."),
		spent:     desc("hybrid_tokens_spent_total", "Leased tokens that admitted a request."),
		refunded:  desc("hybrid_tokens_refunded_total", "Leased tokens given back to Redis unspent."),
		lost:      desc("hybrid_tokens_lost_total", "Leased tokens that could not be refunded (Redis unreachable); never spent."),
		held:      desc("hybrid_tokens_held", "Tokens in leases now."),
		breaker:   desc("breaker_state", "State of the circuit breaker in front of Redis: 1 for the current state.", "state"),
		opens:     desc("breaker_opens_total", "Times the circuit breaker opened."),
		instances: desc("hybrid_instances", "Live instances of the fleet, as last seen in Redis."),
	}, nil
}

// labelValue makes s usable as a label value, which must be UTF-8.
func labelValue(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// Observer returns an Observer that counts into c under limiter=name. Pass
// it to a limiter's WithObserver option (to a concurrency limiter's
// WithPermitObserver for the permit metrics); with other Observers, such
// as an OpenTelemetry bridge's, through tierlimit.Observers. Observers of
// one name share their series.
func (c *Collector) Observer(name string) *tierlimit.Observer {
	name = labelValue(name)
	// The series of the known sources are looked up once: a decision then
	// costs two atomic adds and a histogram observation, no map lookup.
	type series struct {
		allowed, denied prometheus.Counter
		latency         prometheus.Observer
	}
	seriesOf := func(src string) series {
		return series{
			allowed: c.decisions.WithLabelValues(name, src, "allowed"),
			denied:  c.decisions.WithLabelValues(name, src, "denied"),
			latency: c.decisionLat.WithLabelValues(name, src),
		}
	}
	limits := newLimitSeries(c.byLimit, name, c.maxLimits, c.logger)
	var known [4]series
	for s := range known {
		known[s] = seriesOf(tierlimit.Source(s).String())
	}
	of := func(src tierlimit.Source) series {
		if int(src) < len(known) {
			return known[src]
		}
		return seriesOf(src.String())
	}
	return &tierlimit.Observer{
		Decision: func(d tierlimit.Decision) {
			s := of(d.Source)
			if d.Allowed {
				s.allowed.Inc()
			} else {
				s.denied.Inc()
			}
			s.latency.Observe(d.Latency.Seconds())
			limits.count(d)
		},
		RedisCall: func(rc tierlimit.RedisCall) {
			op := labelValue(rc.Op)
			c.calls.WithLabelValues(name, op).Inc()
			if rc.Err != nil {
				c.callErrs.WithLabelValues(name, op).Inc()
			}
			c.callLat.WithLabelValues(name, op).Observe(rc.Latency.Seconds())
		},
		GiveBack: func(g tierlimit.GiveBack) {
			// A series made on the first give-back: most limiters never
			// give back, and a series at 0 would say they might.
			c.decisions.WithLabelValues(name, g.Source.String(), "given_back").Inc()
			limits.countGiveBack(g.Limit)
		},
		Permit: func(d tierlimit.PermitDecision) {
			result := "acquired"
			switch {
			case !d.Acquired && d.Waited > 0:
				result = "gave_up"
			case !d.Acquired:
				result = "refused"
			}
			c.permits.WithLabelValues(name, d.Source.String(), result).Inc()
			if d.Waited > 0 {
				c.permitWait.WithLabelValues(name).Observe(d.Waited.Seconds())
			}
		},
		Breaker: func(b tierlimit.BreakerChange) {
			c.transitions.WithLabelValues(name, b.From.String(), b.To.String()).Inc()
		},
		Eviction: func(r tierlimit.EvictionRisk) {
			risk := 0.0
			switch {
			case !r.Known():
				risk = -1
			case r.Risky():
				risk = 1
			}
			c.evictRisk.WithLabelValues(name).Set(risk)
			c.evicted.WithLabelValues(name).Set(float64(r.EvictedKeys))
		},
	}
}

// WatchHybrid exports l's token ledger, breaker state and fleet size under
// limiter=name, read from l.Stats at each scrape. Its decisions and Redis
// calls come from an Observer (hybrid.WithObserver(c.Observer(name))). It
// returns an error wrapping tierlimit.ErrInvalidOption for a nil limiter or
// a name already watched.
func (c *Collector) WatchHybrid(name string, l *hybrid.Limiter) error {
	if l == nil {
		return invalid("nil hybrid limiter %q", name)
	}
	name = labelValue(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.watched {
		if w.name == name {
			return invalid("hybrid limiter %q is already watched", name)
		}
	}
	c.watched = append(c.watched, watch{name, l})
	return nil
}

// Describe sends the descriptors of every metric c may export.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	c.byLimit.Describe(ch)
	c.decisionLat.Describe(ch)
	c.calls.Describe(ch)
	c.callErrs.Describe(ch)
	c.callLat.Describe(ch)
	c.transitions.Describe(ch)
	c.evictRisk.Describe(ch)
	c.evicted.Describe(ch)
	c.permits.Describe(ch)
	c.permitWait.Describe(ch)
	for _, d := range []*prometheus.Desc{c.leased, c.spent, c.refunded, c.lost, c.held, c.breaker, c.opens, c.instances} {
		ch <- d
	}
}

// Collect sends the current value of every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	c.byLimit.Collect(ch)
	c.decisionLat.Collect(ch)
	c.calls.Collect(ch)
	c.callErrs.Collect(ch)
	c.callLat.Collect(ch)
	c.transitions.Collect(ch)
	c.evictRisk.Collect(ch)
	c.evicted.Collect(ch)
	c.permits.Collect(ch)
	c.permitWait.Collect(ch)
	c.mu.Lock()
	watched := append([]watch(nil), c.watched...)
	c.mu.Unlock()
	for _, w := range watched {
		c.collectHybrid(ch, w.name, w.lim.Stats())
	}
}

var breakerStates = []tierlimit.BreakerState{tierlimit.BreakerClosed, tierlimit.BreakerHalfOpen, tierlimit.BreakerOpen}

func (c *Collector) collectHybrid(ch chan<- prometheus.Metric, name string, s hybrid.Stats) {
	send := func(d *prometheus.Desc, t prometheus.ValueType, v int64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, t, float64(v), append([]string{name}, labels...)...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	send(c.leased, prometheus.CounterValue, s.Leased)
	send(c.spent, prometheus.CounterValue, s.Spent)
	send(c.refunded, prometheus.CounterValue, s.Refunded)
	send(c.lost, prometheus.CounterValue, s.Lost)
	send(c.held, prometheus.GaugeValue, s.Held)
	for _, st := range breakerStates {
		v := int64(0)
		if s.Breaker == st {
			v = 1
		}
		send(c.breaker, prometheus.GaugeValue, v, st.String())
	}
	send(c.opens, prometheus.CounterValue, s.BreakerOpens)
	send(c.instances, prometheus.GaugeValue, s.Instances)
}
