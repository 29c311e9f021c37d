// Package otelbridge records what tierlimit's limiters do through the
// OpenTelemetry metric API, beside the Prometheus collector of package
// metrics and from the same observation hooks (tierlimit.Observer), and
// adds a call's decision to its span when one is recording.
//
// The instruments are named under tierlimit.*, shaped after the one stable
// rate-limiting convention, ASP.NET Core's aspnetcore.rate_limiting.*: a
// counter of decisions with the policy and the result ("acquired" or
// "rejected") as attributes, and a duration histogram. Attribute sets are
// bounded: limiters by the names given to Observer, sources and results
// by their few values, limits as metrics.WithMaxLimits bounds them.
//
//	b, err := otelbridge.New(otel.GetMeterProvider())
//	if err != nil { ... }
//	lim, err := hybrid.New(rdb, limit, hybrid.WithObserver(b.Observer("api")))
//	if err != nil { ... }
//	err = b.WatchHybrid("api", lim)
//	mw, err := httplimit.New(lim, httplimit.WithDecisionFunc(otelbridge.SpanDecision))
//
// otelbridge is a module of its own, so that the users of tierlimit who do
// not use OpenTelemetry do not download it; the core packages import
// neither OpenTelemetry nor this one.
package otelbridge
