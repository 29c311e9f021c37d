// Package bench compares tierlimit's Redis limiters with their peers, each
// in its own module (replace ../) so that the peers never become
// dependencies of tierlimit itself.
//
// Everything runs against throwaway redis-server processes on loopback
// ports (internal/redistest); nothing touches a Redis already running.
// run.sh runs the benchmarks with -count=5 and prints benchstat's table and
// each limiter's ratio to redis_rate (cmd/ratio).
package bench
