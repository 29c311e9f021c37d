package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// The two servers compared: envoyproxy/ratelimit's service_cmd at the
// version go.mod requires, and tierlimit-serve from this repository, each
// built once per test binary into a temporary directory.
const (
	refPkg  = "github.com/envoyproxy/ratelimit/src/service_cmd"
	oursPkg = "github.com/tierlimit/tierlimit/serve/cmd/tierlimit-serve"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// binaries builds both servers, once per test binary (the go command's
// build cache makes later runs cheap).
func binaries(t testing.TB) (ref, ours string) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "rlsbench")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg string }{{"ref", refPkg}, {"ours", oursPkg}} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, b.out), b.pkg)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "ref"), filepath.Join(buildDir, "ours")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// redisServer starts a redis-server for the test, or skips without one
// (fails with TIERLIMIT_REQUIRE_REDIS=1).
func redisServer(t testing.TB) *redistest.Server {
	t.Helper()
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
	redistest.QuietClientLogs()
	return redistest.Start(t)
}

func freePort(t testing.TB) int {
	t.Helper()
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// proc is a server process under test.
type proc struct {
	name string
	addr string // its gRPC address
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startRef runs envoyproxy/ratelimit on the Redis at redisAddr with the
// config yaml, its stats off, its cache keys in their own namespace.
func startRef(t testing.TB, bin, redisAddr, yaml string) *proc {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcPort := freePort(t)
	env := []string{
		"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "GRPC_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(freePort(t)), "DEBUG_PORT=" + strconv.Itoa(freePort(t)),
		"GRPC_PORT=" + strconv.Itoa(grpcPort),
		"CACHE_KEY_PREFIX=ref:",
	}
	return startProc(t, "ref", bin, nil, env, net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)))
}

// startOurs runs tierlimit-serve on the Redis at redisAddr with the config
// yaml.
func startOurs(t testing.TB, bin, redisAddr, yaml string, extra ...string) *proc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcPort := freePort(t)
	args := append([]string{"-config", path, "-redis-url", "redis://" + redisAddr + "/0",
		"-grpc-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)), "-http-addr", "", "-reload-interval", "0"}, extra...)
	return startProc(t, "ours", bin, args, nil, net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)))
}

func startProc(t testing.TB, name, bin string, args, env []string, addr string) *proc {
	t.Helper()
	p := &proc{name: name, addr: addr, out: new(syncBuffer), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.out.String())
		}
	})
	p.waitReady(t)
	return p
}

// waitReady waits until the server answers a request.
func (p *proc) waitReady(t testing.TB) {
	t.Helper()
	c := dial(t, p.addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "readiness",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		cancel()
		if err == nil {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited at start:\n%s", p.name, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not answering: %v\n%s", p.name, err, p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGINT, on which both servers shut down gracefully, and waits
// for the exit (SIGKILL after 15 s).
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// dial returns a client of the RLS server at addr, closed with the test.
func dial(t testing.TB, addr string) rls.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rls.NewRateLimitServiceClient(conn)
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
