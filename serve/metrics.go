package serve

import (
	"strings"
	"sync"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/metrics"
)

// maxDetailed bounds the label values detailed_metric rules add (one per
// descriptor value): past it, their decisions count under the rule's key.
const maxDetailed = 1000

// serverMetrics are the Prometheus metrics of a Server:
//
//	tierlimit_serve_requests_total{domain,code}         code: ok, over_limit, error; domain "unknown" for one not configured
//	tierlimit_serve_request_duration_seconds            histogram of ShouldRateLimit
//	tierlimit_serve_descriptors_total{rule,result}      rule: the rule's full key (with the request's values when detailed_metric), "none" without one;
//	                                                    result: ok, over_limit, shadow_over_limit, unlimited
//	tierlimit_serve_config_loads_total{result}          result: success, error
//	tierlimit_serve_config_last_load_success            1 when the last load or reload succeeded
//
// and package metrics' series of the hybrid limiter, under limiter="serve".
// Without a registerer every method does nothing.
type serverMetrics struct {
	reg         prometheus.Registerer
	col         *metrics.Collector
	requests    *prometheus.CounterVec
	duration    prometheus.Histogram
	descriptors *prometheus.CounterVec
	loads       *prometheus.CounterVec
	lastLoad    prometheus.Gauge

	mu       sync.Mutex
	detailed map[string]bool // the detailed label values in use
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	if reg == nil {
		return &serverMetrics{}, nil
	}
	col, err := metrics.New()
	if err != nil {
		return nil, err
	}
	m := &serverMetrics{
		reg: reg,
		col: col,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tierlimit_serve_requests_total",
			Help: "ShouldRateLimit calls by domain and overall code (ok, over_limit, error).",
		}, []string{"domain", "code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tierlimit_serve_request_duration_seconds",
			Help:    "Time to answer ShouldRateLimit.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tierlimit_serve_descriptors_total",
			Help: "Descriptor decisions by rule and result (ok, over_limit, shadow_over_limit, unlimited).",
		}, []string{"rule", "result"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tierlimit_serve_config_loads_total",
			Help: "Config loads and reloads by result (success, error).",
		}, []string{"result"}),
		lastLoad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tierlimit_serve_config_last_load_success",
			Help: "1 when the last config load or reload succeeded, 0 when the server kept its previous config.",
		}),
		detailed: make(map[string]bool),
	}
	for _, c := range []prometheus.Collector{col, m.requests, m.duration, m.descriptors, m.loads, m.lastLoad} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			return nil, err
		}
	}
	return m, nil
}

func (m *serverMetrics) unregister() {
	for _, c := range []prometheus.Collector{m.col, m.requests, m.duration, m.descriptors, m.loads, m.lastLoad} {
		m.reg.Unregister(c)
	}
}

func (m *serverMetrics) hybridOptions() []hybrid.Option {
	return []hybrid.Option{hybrid.WithObserver(m.col.Observer("serve"))}
}

func (m *serverMetrics) watch(h *hybrid.Limiter) error {
	if m.col == nil {
		return nil
	}
	return m.col.WatchHybrid("serve", h)
}

// unwatch unregisters the metrics at Close, so that a registry outlives its
// server (and a new one may register).
func (m *serverMetrics) unwatch() {
	if m.reg != nil {
		m.unregister()
	}
}

func (m *serverMetrics) configLoaded(ok bool) {
	if m.reg == nil {
		return
	}
	if ok {
		m.loads.WithLabelValues("success").Inc()
		m.lastLoad.Set(1)
	} else {
		m.loads.WithLabelValues("error").Inc()
		m.lastLoad.Set(0)
	}
}

func (m *serverMetrics) request(domain string, cfg *Config, resp *rls.RateLimitResponse, err error, d time.Duration) {
	if m.reg == nil {
		return
	}
	if cfg.domains[domain] == nil {
		domain = "unknown"
	}
	code := "ok"
	switch {
	case err != nil:
		code = "error"
	case resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT:
		code = "over_limit"
	}
	m.requests.WithLabelValues(domain, code).Inc()
	m.duration.Observe(d.Seconds())
}

func (m *serverMetrics) descriptor(domain string, r *Rule, entries []Entry, code rls.RateLimitResponse_Code) {
	if m.reg == nil {
		return
	}
	rule, result := "none", "ok"
	if r != nil {
		rule = r.FullKey
		switch {
		case r.Unlimited:
			result = "unlimited"
		case code == rls.RateLimitResponse_OVER_LIMIT && r.Shadow:
			result = "shadow_over_limit"
		case code == rls.RateLimitResponse_OVER_LIMIT:
			result = "over_limit"
		}
		if r.DetailedMetric {
			rule = m.detailedKey(rule, fullKey(domain, entries))
		}
	}
	if c, err := m.descriptors.GetMetricWithLabelValues(rule, result); err == nil {
		c.Inc()
	}
}

func (m *serverMetrics) detailedKey(rule, key string) string {
	key = strings.ToValidUTF8(key, "\uFFFD")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.detailed[key] {
		return key
	}
	if len(m.detailed) >= maxDetailed {
		return rule
	}
	m.detailed[key] = true
	return key
}
