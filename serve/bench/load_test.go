package bench

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	loadFlag    = flag.Bool("load", false, "run the load comparisons (TestLoad...)")
	loadDur     = flag.Duration("load.duration", 10*time.Second, "how long each load run lasts")
	loadClients = flag.Int("load.clients", 200, "concurrent gRPC clients, each on its own connection")
	loadRounds  = flag.Int("load.rounds", 1, "how many times TestLoadSideBySide runs each server, in turn")
)

func needLoad(t *testing.T) {
	t.Helper()
	if !*loadFlag {
		t.Skip("load comparison: run with -args -load")
	}
}

// result is what one load run measured, client side.
type result struct {
	decisions, admitted, errors int64
	elapsed                     time.Duration
	lat                         []time.Duration // every call's, sorted
	perSecond                   []int64         // admitted in each second of the run
	callsPerSecond              []int64         // calls answered (or failed) in each second
	perAddr                     [][]int64       // perSecond by the address the clients sent to
	firstErr                    string
}

func (r *result) rate() float64 { return float64(r.decisions) / r.elapsed.Seconds() }

func (r *result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

// drive runs clients goroutines, each with its own connection to one of
// addrs in turn, sending next's requests back to back for dur.
func drive(t *testing.T, addrs []string, clients int, dur time.Duration, next func(*rand.Rand) *rls.RateLimitRequest) *result {
	t.Helper()
	return driveWith(t, addrs, clients, dur, next, nil)
}

// driveWith is drive, calling during (when not nil) in a goroutine of its
// own as the clients start, and waiting for it to return.
func driveWith(t *testing.T, addrs []string, clients int, dur time.Duration, next func(*rand.Rand) *rls.RateLimitRequest, during func()) *result {
	t.Helper()
	conns := make([]rls.RateLimitServiceClient, clients)
	for i := range conns {
		conn, err := grpc.NewClient(addrs[i%len(addrs)], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns[i] = rls.NewRateLimitServiceClient(conn)
	}
	seconds := int(dur/time.Second) + 2
	perSecond := make([]atomic.Int64, seconds)
	calls := make([]atomic.Int64, seconds)
	perAddr := make([][]atomic.Int64, len(addrs))
	for i := range perAddr {
		perAddr[i] = make([]atomic.Int64, seconds)
	}
	var decisions, admitted, errs atomic.Int64
	var firstErr atomic.Value
	lats := make([][]time.Duration, clients)
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	if during != nil {
		wg.Go(during)
	}
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			lat := make([]time.Duration, 0, 4096)
			for {
				now := time.Now()
				if now.After(deadline) {
					break
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req := next(rng)
				resp, err := conns[i].ShouldRateLimit(ctx, req)
				cancel()
				end := time.Now()
				lat = append(lat, end.Sub(now))
				if s := int(end.Sub(start) / time.Second); s < seconds {
					calls[s].Add(1)
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				decisions.Add(int64(len(req.Descriptors)))
				if resp.OverallCode == rls.RateLimitResponse_OK {
					admitted.Add(1)
					if s := int(end.Sub(start) / time.Second); s < seconds {
						perSecond[s].Add(1)
						perAddr[i%len(addrs)][s].Add(1)
					}
				}
			}
			lats[i] = lat
		})
	}
	wg.Wait()
	r := &result{decisions: decisions.Load(), admitted: admitted.Load(), errors: errs.Load(), elapsed: time.Since(start)}
	if e, ok := firstErr.Load().(string); ok {
		r.firstErr = e
	}
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	slices.Sort(r.lat)
	for i := range perSecond {
		r.perSecond = append(r.perSecond, perSecond[i].Load())
		r.callsPerSecond = append(r.callsPerSecond, calls[i].Load())
	}
	for _, pa := range perAddr {
		var counts []int64
		for i := range pa {
			counts = append(counts, pa[i].Load())
		}
		r.perAddr = append(r.perAddr, counts)
	}
	return r
}

// commands returns the commands the Redis at addr has processed.
func commands(t *testing.T, addr string) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// procCPU returns the CPU time the process pid has used (user and system),
// from /proc; 0 where /proc is missing.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// redisCPU returns the CPU time the Redis at addr has used.
func redisCPU(t *testing.T, addr string) time.Duration {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// loadConfig limits each client address to rate per second (burst = rate
// on both servers: a token bucket of rate tokens, a fixed window of rate
// per second).
func loadConfig(rate int) string {
	return fmt.Sprintf("domain: load\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: %d}\n", rate)
}

// keys returns n requests, each of one descriptor of its own address.
func keys(n int) []*rls.RateLimitRequest {
	reqs := make([]*rls.RateLimitRequest, n)
	for i := range reqs {
		reqs[i] = &rls.RateLimitRequest{Domain: "load", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}}}}}
	}
	return reqs
}

func pick(reqs []*rls.RateLimitRequest) func(*rand.Rand) *rls.RateLimitRequest {
	return func(rng *rand.Rand) *rls.RateLimitRequest { return reqs[rng.IntN(len(reqs))] }
}

// TestLoadSideBySide drives each server in turn, alone on a fresh
// redis-server, with the same clients: 10 hot descriptors, then 10,000 cold
// ones, at a limit no key reaches (every decision is an admission, the
// path both servers take most). It reports decisions/s, Redis commands per
// 1,000 decisions and latency percentiles, client side.
func TestLoadSideBySide(t *testing.T) {
	needLoad(t)
	refBin, oursBin := binaries(t)
	const rate = 1_000_000
	for _, sc := range []struct {
		name string
		keys int
	}{{"10 hot descriptors", 10}, {"10k cold descriptors", 10_000}} {
		reqs := keys(sc.keys)
		for round := range *loadRounds * 2 {
			srv := [...]string{"reference", "ours"}[round%2]
			rs := redisServer(t)
			var p *proc
			if srv == "reference" {
				p = startRef(t, refBin, rs.Addr, loadConfig(rate))
			} else {
				p = startOurs(t, oursBin, rs.Addr, loadConfig(rate))
			}
			before := commands(t, rs.Addr)
			cpu0, rcpu0 := procCPU(p.cmd.Process.Pid), redisCPU(t, rs.Addr)
			r := drive(t, []string{p.addr}, *loadClients, *loadDur, pick(reqs))
			cpu, rcpu := procCPU(p.cmd.Process.Pid)-cpu0, redisCPU(t, rs.Addr)-rcpu0
			cmds := commands(t, rs.Addr) - before - 3
			p.stop()
			perDecision := func(d time.Duration) time.Duration { return d / time.Duration(max(r.decisions, 1)) }
			t.Logf("round %d, %s, %s: %.0f decisions/s, %.1f Redis commands per 1,000 decisions, CPU per decision: server %v + Redis %v, p50 %v p99 %v p99.9 %v, %d errors %s",
				round/2+1, sc.name, srv, r.rate(), float64(cmds)*1000/float64(max(r.decisions, 1)),
				perDecision(cpu).Round(100*time.Nanosecond), perDecision(rcpu).Round(100*time.Nanosecond),
				r.pct(.5).Round(time.Microsecond), r.pct(.99).Round(time.Microsecond), r.pct(.999).Round(time.Microsecond),
				r.errors, r.firstErr)
		}
	}
}

// TestLoadReplicas runs 3 replicas of ours on one redis-server, the
// clients spread over them, all on one key at 1,000/s: the fleet must admit
// at most what one bucket allows over the run, 1,000 + 1,000/s × elapsed.
func TestLoadReplicas(t *testing.T) {
	needLoad(t)
	_, oursBin := binaries(t)
	rs := redisServer(t)
	const rate = 1000
	var addrs []string
	for range 3 {
		addrs = append(addrs, startOurs(t, oursBin, rs.Addr, loadConfig(rate)).addr)
	}
	reqs := keys(1)
	r := drive(t, addrs, *loadClients, *loadDur, pick(reqs))
	bound := float64(rate) + float64(rate)*r.elapsed.Seconds()
	t.Logf("3 replicas, 1 key at %d/s for %v: %d decisions, %d admitted, one bucket allows %.0f: %.4f×; %d errors %s; admitted per second %v",
		rate, r.elapsed.Round(time.Millisecond), r.decisions, r.admitted, bound, float64(r.admitted)/bound, r.errors, r.firstErr, r.perSecond)
	if float64(r.admitted) > 1.02*bound {
		t.Errorf("admitted %d > 1.02 × %.0f", r.admitted, bound)
	}
}

// TestLoadRedisOutage runs 3 replicas under load on 10 keys at 1,000/s each,
// kills their redis-server 3 s in, and starts it again, empty, on the same
// port 5 s later: no client may see an error, and while Redis is down the
// replicas admit within their fallback shares (each replica a third of
// each key's limit).
func TestLoadRedisOutage(t *testing.T) {
	needLoad(t)
	_, oursBin := binaries(t)
	rs := redisServer(t)
	const rate = 1000
	var addrs []string
	for range 3 {
		addrs = append(addrs, startOurs(t, oursBin, rs.Addr, loadConfig(rate)).addr)
	}
	reqs := keys(10)
	dur := max(*loadDur, 13*time.Second)
	r := driveWith(t, addrs, *loadClients, dur, pick(reqs), func() {
		time.Sleep(3 * time.Second)
		rs.Kill()
		time.Sleep(5 * time.Second)
		rs.RestartKeeping(t)
	})
	t.Logf("3 replicas, 10 keys at %d/s each, Redis killed at 3 s and back at 8 s: %d decisions, %d errors %s; calls per second %v; admitted per second (10 keys: %d/s allowed) %v; by replica %v",
		rate, r.decisions, r.errors, r.firstErr, r.callsPerSecond, 10*rate, r.perSecond, r.perAddr)
	if r.errors != 0 {
		t.Errorf("%d errors, want 0", r.errors)
	}
	// Seconds 4 to 7 are wholly inside the outage. Each replica holds each
	// key to its share, a third of the limit: over those 4 s a bucket of a
	// third of the burst and a third of the rate, for 10 keys.
	share := int64(10 * rate / 3)
	bound := share + 4*share
	for i, pa := range r.perAddr {
		var got int64
		for s := 4; s < 8 && s < len(pa); s++ {
			got += pa[s]
		}
		t.Logf("replica %d admitted %d in seconds 4-7 of the run, its fallback shares allow %d", i, got, bound)
		if got > bound*102/100 {
			t.Errorf("replica %d admitted %d while Redis was down, above its fallback shares' %d", i, got, bound)
		}
	}
}

// TestLoadReload rewrites the config of one replica under load, every
// 100 ms, between two valid configs, with a SIGHUP each time: no request
// may fail.
func TestLoadReload(t *testing.T) {
	needLoad(t)
	_, oursBin := binaries(t)
	rs := redisServer(t)
	p := startOurs(t, oursBin, rs.Addr, loadConfig(1000))
	path := configPath(t, p)
	stop := make(chan struct{})
	var reloads int
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			reloads++
			if err := os.WriteFile(path, []byte(loadConfig(1000+reloads%2)), 0o644); err != nil {
				t.Error(err)
				return
			}
			p.cmd.Process.Signal(syscall.SIGHUP)
		}
	})
	r := drive(t, []string{p.addr}, *loadClients, *loadDur, pick(keys(100)))
	close(stop)
	wg.Wait()
	t.Logf("1 replica, 100 keys, %d reloads in %v: %d decisions, %d errors %s",
		reloads, r.elapsed.Round(time.Millisecond), r.decisions, r.errors, r.firstErr)
	if r.errors != 0 {
		t.Errorf("%d errors, want 0", r.errors)
	}
	if n := strings.Count(p.out.String(), "config reloaded"); n == 0 {
		t.Errorf("no reload logged:\n%s", p.out.String())
	}
}

// configPath returns the -config argument p was started with.
func configPath(t *testing.T, p *proc) string {
	t.Helper()
	for i, a := range p.cmd.Args {
		if a == "-config" && i+1 < len(p.cmd.Args) {
			return p.cmd.Args[i+1]
		}
	}
	t.Fatal("no -config")
	return ""
}
