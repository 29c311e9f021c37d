package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// hotKey is the one key every benchmark call asks for, as under one busy
// client. Each limiter derives its own Redis key from it, so the peers never
// share state.
const hotKey = "user:42"

// BenchmarkRemote measures one serial Allow on a hot key that is almost
// never denied: 10^6 per second, the finest limit tierlimit accepts, is far
// more than one connection can ask for.
func BenchmarkRemote(b *testing.B) {
	benchRemote(b, tierlimit.PerSecond(1_000_000), true)
}

// BenchmarkRemoteDenied measures the denied path: one event per hour, so
// every call after the first is denied.
func BenchmarkRemoteDenied(b *testing.B) {
	benchRemote(b, tierlimit.PerHour(1), false)
}

// benchRemote runs every peer against one redis-server with one client
// (default pool), each as a sub-benchmark named after the peer. It fails a
// sub-benchmark when more than 1% of its calls took the other path.
//
// Besides ns/op, which on loopback is mostly round trip and scheduling, it
// reports server-ns/op, the time Redis itself spent running the script, and
// cmds/op, the Redis commands the script ran (both from INFO commandstats):
// other load on the machine disturbs the first less than ns/op, and the
// second not at all.
func benchRemote(b *testing.B, l tierlimit.Limit, wantAllowed bool) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	for _, p := range peers {
		b.Run(p.name, func(b *testing.B) {
			allow, err := p.build(rdb, l)
			if err != nil {
				b.Fatalf("build %s for %v: %v", p.name, l, err)
			}
			// Load the script and open the connection before timing.
			if _, _, err := allow(ctx, hotKey); err != nil {
				b.Fatalf("%s: first Allow: %v", p.name, err)
			}
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatalf("CONFIG RESETSTAT: %v", err)
			}
			b.ReportAllocs()
			calls, off := 0, 0
			for b.Loop() {
				ok, _, err := allow(ctx, hotKey)
				if err != nil {
					b.Fatalf("%s: Allow: %v", p.name, err)
				}
				calls++
				if ok != wantAllowed {
					off++
				}
			}
			if off*100 > calls {
				b.Errorf("%s: %d of %d calls had Allowed = %v, want %v", p.name, off, calls, !wantAllowed, wantAllowed)
			}
			st, err := readScriptStats(ctx, rdb)
			if err != nil {
				b.Fatalf("INFO commandstats: %v", err)
			}
			if st.scripts < int64(calls) {
				b.Fatalf("%s: Redis counted %d script calls, want at least %d", p.name, st.scripts, calls)
			}
			b.ReportMetric(float64(st.usec)*1e3/float64(st.scripts), "server-ns/op")
			b.ReportMetric(float64(st.inner)/float64(st.scripts), "cmds/op")
		})
	}
}

// scriptStats is what Redis counted since the last CONFIG RESETSTAT.
type scriptStats struct {
	scripts int64 // EVALSHA and EVAL calls
	usec    int64 // µs spent running them, the commands they ran included
	inner   int64 // data commands the scripts ran (GET, HSET, TIME, ...)
}

// outside lists the commands that are not run by scripts: the scripts
// themselves, this file's bookkeeping and the client's connection set-up.
var outside = []string{"eval", "evalsha", "info", "config|", "hello", "client|", "ping", "script|"}

// readScriptStats parses INFO commandstats, whose lines look like
// "cmdstat_hset:calls=3,usec=12,usec_per_call=4.00,rejected_calls=0,failed_calls=0".
func readScriptStats(ctx context.Context, rdb *redis.Client) (scriptStats, error) {
	var st scriptStats
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return st, err
	}
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var calls, usec int64
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &calls
			case "usec":
				dst = &usec
			default:
				continue
			}
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return st, fmt.Errorf("%s %s: %w", name, f, err)
			}
		}
		switch {
		case name == "eval" || name == "evalsha":
			st.scripts += calls
			st.usec += usec
		case !slices.ContainsFunc(outside, func(o string) bool {
			return name == o || strings.HasSuffix(o, "|") && strings.HasPrefix(name, o)
		}):
			st.inner += calls
		}
	}
	return st, nil
}

// BenchmarkRemotePaired is BenchmarkRemote with redis_rate interleaved:
// each iteration makes one call of ours and one of redis_rate on the same
// client, timing each. The ratio of their times ("×redis_rate") then comes
// from the same seconds of the same run, so load that other work puts on
// this shared machine for a while (it moved BenchmarkRemote's ratios by
// ±0.4 between sub-benchmarks run a minute apart) falls on both alike.
// "ns/call" is ours alone; the framework's ns/op is the pair.
func BenchmarkRemotePaired(b *testing.B) {
	benchPaired(b, tierlimit.PerSecond(1_000_000), true)
}

// BenchmarkRemoteDeniedPaired is BenchmarkRemoteDenied, paired likewise.
func BenchmarkRemoteDeniedPaired(b *testing.B) {
	benchPaired(b, tierlimit.PerHour(1), false)
}

func benchPaired(b *testing.B, l tierlimit.Limit, wantAllowed bool) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	base, err := redisRate(rdb, l)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range peers {
		if p.name == baseline {
			continue
		}
		b.Run(p.name, func(b *testing.B) {
			allow, err := p.build(rdb, l)
			if err != nil {
				b.Fatalf("build %s for %v: %v", p.name, l, err)
			}
			// Both keys fresh, both scripts loaded, the connection open.
			key, baseKey := hotKey+":"+p.name, hotKey+":"+p.name+":rr"
			for _, f := range []func() (bool, int64, error){
				func() (bool, int64, error) { return allow(ctx, key) },
				func() (bool, int64, error) { return base(ctx, baseKey) },
			} {
				if _, _, err := f(); err != nil {
					b.Fatalf("%s: first call: %v", p.name, err)
				}
			}
			var ourNs, baseNs int64
			calls, off := 0, 0
			for b.Loop() {
				t0 := time.Now()
				ok, _, err := allow(ctx, key)
				t1 := time.Now()
				if err != nil {
					b.Fatalf("%s: Allow: %v", p.name, err)
				}
				okBase, _, err := base(ctx, baseKey)
				t2 := time.Now()
				if err != nil {
					b.Fatalf("redis_rate: Allow: %v", err)
				}
				ourNs += t1.Sub(t0).Nanoseconds()
				baseNs += t2.Sub(t1).Nanoseconds()
				calls++
				if ok != wantAllowed || okBase != wantAllowed {
					off++
				}
			}
			if off*100 > calls {
				b.Errorf("%s: %d of %d pairs had a call with Allowed = %v", p.name, off, calls, !wantAllowed)
			}
			b.ReportMetric(float64(ourNs)/float64(calls), "ns/call")
			b.ReportMetric(float64(baseNs)/float64(calls), "redis_rate-ns/call")
			b.ReportMetric(float64(ourNs)/float64(baseNs), "×redis_rate")
		})
	}
}
