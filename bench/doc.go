// Package bench compares tierlimit's Redis limiters with their peers, each
// in its own module (replace ../) so that the peers never become
// dependencies of tierlimit itself.
//
// BenchmarkCompare runs every tierlimit strategy (local, hybrid, remote
// token bucket and GCRA) against x/time/rate, sethvargo/go-limiter,
// ulule/limiter, throttled and redis_rate, all held to one limit, on a hot
// key, 10,000 keys uniform and 10,000 keys Zipf, serial and parallel; it
// reports Redis round trips per decision besides time and allocations.
// TestPeersAgree and TestContendersAdmitTheLimit check that every peer is
// wired to that limit. The earlier benchmarks (BenchmarkRemote,
// BenchmarkHotKey, BenchmarkZipf10k) measure our limiters in more detail.
//
// Everything runs against throwaway redis-server processes on loopback
// ports (internal/redistest); nothing touches a Redis already running.
// run.sh runs the benchmarks with -count=5 and prints benchstat's table and
// cmd/compare's tables (docs/comparison.md), or cmd/ratio's ratios for the
// earlier benchmarks.
package bench
