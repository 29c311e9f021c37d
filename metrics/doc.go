// Package metrics exports what tierlimit's limiters do as Prometheus
// metrics, so that the limiters themselves need not import Prometheus.
//
// A [Collector] hands out [tierlimit.Observer] values, one per limiter
// name, that count decisions by result and source, Redis calls and errors
// by operation, circuit-breaker changes and latencies; and it reads the
// token ledger, breaker state and fleet size of hybrid limiters at scrape
// time ([Collector.WatchHybrid]).
//
//	c, err := metrics.New()
//	if err != nil { ... }
//	prometheus.MustRegister(c)
//	lim, err := hybrid.New(rdb, limit, hybrid.WithObserver(c.Observer("api")))
//	if err != nil { ... }
//	err = c.WatchHybrid("api", lim)
package metrics
