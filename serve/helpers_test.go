package serve

import (
	"context"
	"net"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// testCtx is a context that ends with the test, bounded so that a hung
// call fails the test instead of the run.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// served is a Server behind a gRPC server and a client of it.
type served struct {
	s      *Server
	g      *grpc.Server
	health *health.Server
	client rls.RateLimitServiceClient
	conn   *grpc.ClientConn
}

// patient is the hybrid call budget of the tests of the server's answers.
// A claim slower than the budget (default 25 ms) denies its key for that
// long, by design (docs/design.md, G1): on a loaded machine, under the race
// detector, that would turn a step's OK into OVER_LIMIT. These tests check
// what the server answers for what the limiter decided, not hybrid's
// timing, which hybrid's own tests check with its defaults.
var patient = WithHybridOptions(hybrid.WithCallBudget(5 * time.Second))

// newServer starts a Server of yaml on rdb, on a bufconn listener, with
// the patient call budget.
func newServer(t testing.TB, yaml string, rdb redis.UniversalClient, opts ...Option) *served {
	t.Helper()
	cfg, err := ParseConfig(File{Name: "test.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	s, err := New(cfg, rdb, append([]Option{patient}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis := bufconn.Listen(1 << 20)
	return serveOn(t, s, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
}

func serveOn(t testing.TB, s *Server, lis net.Listener, dial func(context.Context, string) (net.Conn, error)) *served {
	t.Helper()
	g := grpc.NewServer()
	h := s.Register(g)
	go g.Serve(lis)
	copts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	target := lis.Addr().String()
	if dial != nil {
		copts = append(copts, grpc.WithContextDialer(dial))
		target = "passthrough:///bufnet"
	}
	conn, err := grpc.NewClient(target, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		s.Close()
	})
	return &served{s: s, g: g, health: h, client: rls.NewRateLimitServiceClient(conn), conn: conn}
}

// mini returns a client of a fresh miniredis, closed with the test.
func mini(t testing.TB) redis.UniversalClient {
	t.Helper()
	_, rdb := redistest.Mini(t)
	return rdb
}

// realRedis starts a redis-server for the test: it skips without one,
// unless TIERLIMIT_REQUIRE_REDIS=1 makes a missing one a failure.
func realRedis(t testing.TB) *redistest.Server {
	t.Helper()
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
	return redistest.Start(t)
}

// desc builds a descriptor of key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, descs ...*rlcommon.RateLimitDescriptor) *rls.RateLimitRequest {
	return &rls.RateLimitRequest{Domain: domain, Descriptors: descs}
}
