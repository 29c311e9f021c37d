package serve

import (
	"net"
	"strconv"
	"sync"
	"testing"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// startTCP runs a Server of yaml on rdb behind a gRPC server on a loopback
// port, with a client connected over TCP.
func startTCP(t *testing.T, yaml string, rdb redis.UniversalClient, opts ...Option) *served {
	t.Helper()
	cfg, err := ParseConfig(File{Name: "e2e.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, rdb, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s, lis, nil)
}

func newRedisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

const e2eConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: window
    rate_limit: {unit: day, requests_per_unit: 4, algorithm: fixed_window}
`

// TestEndToEnd runs three replicas of the server on one real redis-server,
// each with its own Redis client, and a gRPC client over TCP that sends
// each request to the next replica: together they admit what one bucket
// holds, exactly, and the remote fixed window likewise.
func TestEndToEnd(t *testing.T) {
	s := realRedis(t)
	var replicas []*served
	for range 3 {
		replicas = append(replicas, startTCP(t, e2eConfig, newRedisClient(t, s.Addr), patient))
	}
	ctx := testCtx(t)
	for _, tc := range []struct {
		desc []string
		want int
	}{
		{[]string{"remote_address", "192.0.2.1"}, 10},
		{[]string{"remote_address", "192.0.2.2"}, 10},
		{[]string{"window", "w"}, 4},
	} {
		admitted := 0
		for i := range 30 {
			resp, err := replicas[i%3].client.ShouldRateLimit(ctx, request("edge", desc(tc.desc...)))
			if err != nil {
				t.Fatalf("%v request %d: %v", tc.desc, i, err)
			}
			if resp.OverallCode == rls.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != tc.want {
			t.Errorf("%v: 3 replicas admitted %d of 30, want %d (one bucket)", tc.desc, admitted, tc.want)
		}
	}
}

// TestRedisDown kills the redis-server under a replica with hybrid's
// default options: every request is still answered, without an error, from
// hybrid's fallback.
func TestRedisDown(t *testing.T) {
	s := realRedis(t)
	redistest.QuietClientLogs()
	srv := startTCP(t, e2eConfig, newRedisClient(t, s.Addr))
	ctx := testCtx(t)
	call := func() error {
		_, err := srv.client.ShouldRateLimit(ctx, request("edge", desc("api", "k"), desc("remote_address", "192.0.2.9")))
		return err
	}
	for range 5 {
		if err := call(); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}
	s.Kill()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 8 {
		wg.Go(func() {
			for range 25 {
				if err := call(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("with Redis down: %v", err)
	}
	if st := srv.s.tiers.hybrid.Stats(); st.Fallback == 0 {
		t.Errorf("Stats = %+v, want fallback decisions", st)
	}
}

// TestGracefulClose checks that Close gives the tokens a replica holds back
// to Redis.
func TestGracefulClose(t *testing.T) {
	s := realRedis(t)
	srv := startTCP(t, e2eConfig, newRedisClient(t, s.Addr), patient)
	ctx := testCtx(t)
	for range 50 {
		if _, err := srv.client.ShouldRateLimit(ctx, request("edge", desc("api", "k"))); err != nil {
			t.Fatal(err)
		}
	}
	if st := srv.s.tiers.hybrid.Stats(); st.Held == 0 {
		t.Fatalf("Stats before Close = %+v, want tokens held", st)
	}
	srv.g.GracefulStop()
	if err := srv.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st := srv.s.tiers.hybrid.Stats()
	if st.Held != 0 || st.Refunded == 0 || st.Lost != 0 || st.Leased != st.Spent+st.Refunded {
		t.Errorf("Stats after Close = %+v, want every unspent token refunded", st)
	}
}

// TestCluster runs the server on a 3-master Redis Cluster (go-redis's
// ClusterClient): every tier and a remote algorithm decide there, and the
// keys of many descriptors, spread over the slots, each count apart.
func TestCluster(t *testing.T) {
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
	c := redistest.StartCluster(t)
	srv := startTCP(t, e2eConfig, c.Client(t), patient)
	ctx := testCtx(t)
	for i := range 20 {
		addr := "192.0.2." + strconv.Itoa(i)
		admitted := 0
		for range 12 {
			resp, err := srv.client.ShouldRateLimit(ctx, request("edge", desc("remote_address", addr)))
			if err != nil {
				t.Fatalf("%s: %v", addr, err)
			}
			if resp.OverallCode == rls.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != 10 {
			t.Errorf("%s: admitted %d of 12, want 10", addr, admitted)
		}
	}
	runStepsOn(t, srv, []rls.RateLimitResponse_Code{ok, ok, ok, ok, over}, "window", "w")
}

// runStepsOn sends the descriptor kv to srv once per code and checks each
// answer's overall code.
func runStepsOn(t *testing.T, srv *served, want []rls.RateLimitResponse_Code, kv ...string) {
	t.Helper()
	ctx := testCtx(t)
	for i, w := range want {
		resp, err := srv.client.ShouldRateLimit(ctx, request("edge", desc(kv...)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.OverallCode != w {
			t.Errorf("request %d: %v, want %v", i, resp.OverallCode, w)
		}
	}
}
