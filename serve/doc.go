// Package serve is an Envoy rate-limit service: a gRPC server of RLS v3
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) that decides
// on tierlimit's limiters, by default hybrid leases, so that most decisions
// make no Redis round trip, the replicas of the service admit what one
// token bucket allows, and decisions go on while Redis is down.
//
// The config is envoyproxy/ratelimit's YAML (domain, nested descriptors of
// key and optional value, rate_limit with unit and requests_per_unit,
// unlimited, name and replaces, shadow_mode, detailed_metric), matched the
// way it matches, with three more fields in rate_limit: algorithm
// (token_bucket, the default, gcra, fixed_window, anchored_window,
// sliding_window, sliding_log), burst (token_bucket and gcra), and tier
// (hybrid, the default for the token bucket; remote, one Redis call per
// decision, the only tier of the other algorithms; local, per replica).
//
// The command tierlimit-serve (serve/cmd/tierlimit-serve) runs a Server with
// reload, health, metrics and graceful shutdown; docs/serve.md shows how to
// put it behind Envoy.
package serve
