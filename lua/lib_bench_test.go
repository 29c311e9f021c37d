package lua

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// BenchmarkLib measures one decision of each limiter script, on a real
// redis-server with go-redis's default client, in two variants side by
// side: "shaken" (the script as sent: the helpers of lib.lua it calls, then
// the file) and "whole" (all of lib.lua, then the file). Scenarios: one hot
// key allowed, 10,000 keys in turn allowed, one hot key denied.
// server-ns/op is the server's time per EVALSHA from INFO commandstats.
func BenchmarkLib(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		b.Fatal(err)
	}
	for _, sc := range benchScripts {
		src, err := Source(sc.file)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := files.ReadFile(sc.file)
		variants := []struct {
			name string
			s    *redis.Script
		}{
			{"shaken", redis.NewScript(src)},
			{"whole", redis.NewScript(string(lib) + "\n" + string(body))},
		}
		for _, scen := range []struct {
			name    string
			limit   tierlimit.Limit
			keys    int
			allowed bool
		}{
			{"hot", tierlimit.PerSecond(1_000_000), 1, true},
			{"many", tierlimit.PerSecond(1_000_000), 10_000, true},
			{"denied", tierlimit.PerHour(1), 1, false},
		} {
			for vi, v := range variants {
				b.Run(fmt.Sprintf("script=%s/keys=%s/lib=%s", sc.name, scen.name, v.name), func(b *testing.B) {
					keys := make([][]string, scen.keys)
					for i := range keys {
						base := fmt.Sprintf("bench:%s:%d:{%016x}:user:%d", sc.name, vi, i, i)
						for _, s := range sc.suffixes {
							keys[i] = append(keys[i], base+s)
						}
					}
					args := sc.args(scen.limit)
					// Load the script, open the connection and give every
					// key its state before timing.
					if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
						v.s.Load(ctx, p)
						for _, k := range keys {
							v.s.EvalSha(ctx, p, k, args...)
						}
						return nil
					}); err != nil {
						b.Fatal(err)
					}
					if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					b.ReportAllocs()
					calls, off := 0, 0
					for b.Loop() {
						r, err := v.s.Run(ctx, rdb, keys[calls%len(keys)], args...).Slice()
						if err != nil {
							b.Fatal(err)
						}
						calls++
						if (r[0].(int64) == 1) != scen.allowed {
							off++
						}
					}
					if off*100 > calls {
						b.Errorf("%d of %d calls had the other outcome", off, calls)
					}
					n, usec := evalshaStats(b, rdb)
					if n < int64(calls) {
						b.Fatalf("Redis counted %d EVALSHA, want %d", n, calls)
					}
					b.ReportMetric(float64(usec)*1e3/float64(n), "server-ns/op")
				})
			}
		}
	}
}

// benchScripts are the limiter scripts, with their per-limit key suffixes
// and ARGV as remote builds them for one limit (server clock, n = 1).
var benchScripts = []struct {
	name, file string
	suffixes   []string
	args       func(tierlimit.Limit) []any
}{
	{"tokenbucket", "tokenbucket.lua", []string{""}, func(l tierlimit.Limit) []any {
		unit, per := l.Scale()
		return []any{0, 1, 1, 0, unit, per, l.Capacity() * unit}
	}},
	{"gcra", "gcra.lua", []string{""}, func(l tierlimit.Limit) []any {
		t := (l.PeriodMicros() + l.Rate - 1) / l.Rate
		return []any{0, 1, t, l.Capacity() * t}
	}},
	{"fixedwindow", "fixedwindow.lua", []string{""}, func(l tierlimit.Limit) []any {
		return []any{0, 1, l.PeriodMicros(), l.Rate}
	}},
	{"anchoredwindow", "anchoredwindow.lua", []string{""}, func(l tierlimit.Limit) []any {
		return []any{0, 1, l.PeriodMicros(), l.Rate}
	}},
	{"slidingwindow", "slidingwindow.lua", []string{""}, func(l tierlimit.Limit) []any {
		p, q := l.PeriodMicros(), int64(1)
		for l.Rate > (1<<51)/(p/q) {
			q *= 2
		}
		return []any{0, 1, p, l.Rate, q}
	}},
	{"slidinglog", "slidinglog.lua", []string{":z", ":h"}, func(l tierlimit.Limit) []any {
		return []any{0, 1, l.PeriodMicros(), l.Rate}
	}},
}

// evalshaStats returns the EVALSHA calls and µs INFO commandstats counted.
func evalshaStats(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return calls, usec
}

// BenchmarkLibPaired is BenchmarkLib with the two variants interleaved:
// each iteration makes one call of each, in turn first, on the same
// client, timing each, so that load other work puts on the machine falls on
// both alike. It reports each variant's ns/call and the ratio whole/shaken;
// ns/op is the two calls.
func BenchmarkLibPaired(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		b.Fatal(err)
	}
	for _, sc := range benchScripts {
		src, err := Source(sc.file)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := files.ReadFile(sc.file)
		scripts := []*redis.Script{
			redis.NewScript(src),
			redis.NewScript(string(lib) + "\n" + string(body)),
		}
		for _, scen := range []struct {
			name  string
			limit tierlimit.Limit
			keys  int
		}{
			{"hot", tierlimit.PerSecond(1_000_000), 1},
			{"many", tierlimit.PerSecond(1_000_000), 10_000},
			{"denied", tierlimit.PerHour(1), 1},
		} {
			b.Run(fmt.Sprintf("script=%s/keys=%s", sc.name, scen.name), func(b *testing.B) {
				keys := make([][][]string, len(scripts))
				for vi := range scripts {
					keys[vi] = make([][]string, scen.keys)
					for i := range keys[vi] {
						base := fmt.Sprintf("lib:%s:%d:{%016x}:user:%d", sc.name, vi, i, i)
						for _, s := range sc.suffixes {
							keys[vi][i] = append(keys[vi][i], base+s)
						}
					}
				}
				args := sc.args(scen.limit)
				if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					for vi, s := range scripts {
						s.Load(ctx, p)
						for _, k := range keys[vi] {
							s.EvalSha(ctx, p, k, args...)
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				var ns [2]int64
				calls := 0
				for b.Loop() {
					for j := range scripts {
						vi := (calls + j) % len(scripts)
						t0 := time.Now()
						if err := scripts[vi].Run(ctx, rdb, keys[vi][calls%scen.keys], args...).Err(); err != nil {
							b.Fatal(err)
						}
						ns[vi] += time.Since(t0).Nanoseconds()
					}
					calls++
				}
				for vi, name := range []string{"shaken", "whole"} {
					b.ReportMetric(float64(ns[vi])/float64(calls), name+"-ns/call")
				}
				b.ReportMetric(float64(ns[1])/float64(ns[0]), "whole/shaken")
			})
		}
	}
}
