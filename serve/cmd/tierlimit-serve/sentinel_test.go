package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// startSentinel runs a Sentinel (redis-server --sentinel) watching the
// master at addr as "mymaster", and returns its address once it names
// the master.
func startSentinel(t *testing.T, master *redistest.Server) string {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	data := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.Port)
	if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv(redistest.ServerEnv)
	if bin == "" {
		bin = "redis-server"
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		cancel()
		if err == nil && len(got) == 2 && got[1] == strconv.Itoa(master.Port) {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not name the master: %v %v", addr, got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSentinel runs the command with -redis-addrs and -redis-master on a
// Sentinel watching a real redis-server: its decisions land in that
// master.
func TestSentinel(t *testing.T) {
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
	master := redistest.Start(t)
	sentinel := startSentinel(t, master)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	var logs syncBuffer
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-http-addr", "",
			"-redis-addrs", sentinel, "-redis-master", "mymaster", "-call-budget", "5s"}, &logs, nil,
			func(g, _ string) { addrs <- g })
	}()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rls.NewRateLimitServiceClient(conn)
	admitted := 0
	for range 5 {
		resp, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if resp.OverallCode == rls.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("admitted %d of 5 at 3 per hour, want 3", admitted)
	}
	// The state is in the master the Sentinel names.
	keys, err := master.Client(t).Keys(ctx, "tierlimit:*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("keys in the master: %v, %v; want the limiter's", keys, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}
