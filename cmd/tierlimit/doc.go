// Command tierlimit shows and measures the rate limiters of
// github.com/tierlimit/tierlimit.
//
//	go run ./cmd/tierlimit demo
//	go install github.com/tierlimit/tierlimit/cmd/tierlimit@latest
//
// # demo
//
//	tierlimit demo [-duration 12s] [-plot FILE.png] [-redis URL]
//
// A simulated fleet: per strategy, 3 limiter instances, each with its own
// Redis client, share a limit of 1000/s (burst 200) on one hot key. The
// strategies are local (a token bucket per key in each instance,
// package local), remote-tb and remote-gcra (one Lua call per decision,
// package remote) and hybrid (leased tokens spent in process, package
// hybrid). First each runs alone, as fast as 8 goroutines per instance can
// call it, and a table shows decisions/s, p50/p99 latency, Redis calls per
// 1000 decisions, admitted against what the limit allows, and errors. Then
// all run at once at twice the limit while the Redis is killed and
// restarted, empty, on the same port, and a second table shows the admitted
// rate and the failed calls before, during and after the outage; -plot
// charts them over time. Redis is embedded (miniredis, in process, on a
// loopback port) unless -redis names a real one, which is never killed: the
// outage is then skipped.
//
// # bench
//
//	tierlimit bench [-redis URL] [-rate 1000] [-period 1s] [-burst 0] [-keys 1] [-zipf 0]
//	                [-instances 3] [-concurrency 8] [-duration 5s]
//	                [-strategies local,remote-tb,remote-gcra,hybrid] [-json]
//
// The demo's first table for your Redis and limit, over -keys keys drawn
// uniformly or, with -zipf s (s > 1), Zipf-skewed. With -json it prints one
// JSON object, schema "tierlimit.bench/v1", stable: a change of meaning or
// a removed field gets a new schema name.
//
//	{
//	  "schema": "tierlimit.bench/v1",
//	  "redis": "embedded",            // or "redis://host:port/db" (never credentials)
//	  "limit": {"rate": 1000, "period_us": 1000000, "burst": 1000},  // burst: the capacity
//	  "keys": 1, "zipf": 0, "instances": 3, "concurrency": 8,
//	  "duration_s": 5,                // asked per strategy
//	  "results": [{                   // one per strategy, in the order run
//	    "strategy": "hybrid",         // local, remote-tb, remote-gcra or hybrid
//	    "elapsed_s": 5.0,             // measured
//	    "decisions": 51000000,        // calls that returned a decision (not an error)
//	    "decisions_per_s": 10200000,
//	    "p50_ns": 200, "p99_ns": 450, // latency of one call, sampled, within 12.5%
//	    "redis_calls": 900,           // script calls (EVALSHA, EVAL) the instances' clients sent
//	    "redis_calls_per_1000": 0.0176, // per 1000 decisions
//	    "admitted": 5990,
//	    "allowed": 6000,              // the most a token bucket per key admits for the demand each key saw
//	    "errors": 0,                  // calls that returned an error
//	    "first_error": ""
//	  }]
//	}
//
// # inspect
//
//	tierlimit inspect [-redis URL] [-prefix tierlimit:] [-rate N -period D -burst N] KEY
//
// The state KEY has in Redis: every key of ours for it (found with SCAN by
// its hash tag), the algorithm, the value decoded, and the TTL; with the
// limit given, what is left now; and one line on whether Redis may evict
// the limiters' keys. -redis may name one server, any node of a Redis
// Cluster, or a Cluster's seeds (redis://host:port?addr=host2:port2): on a
// Cluster, inspect reads the master that owns KEY's slot, and the eviction
// settings of every master.
//
// # Exit status
//
// 0 on success, 1 when the command could not do its job (e.g. Redis
// unreachable), 2 for a bad command line. Errors are one line on stderr;
// progress goes to stderr, results to stdout.
package main
