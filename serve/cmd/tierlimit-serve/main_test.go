package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
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

// TestRun runs the command on the embedded Redis, with a call budget long
// enough that a loaded machine does not turn a claim into a denial (see
// serve's tests): it answers RLS calls,
// health checks and scrapes, reloads on SIGHUP (keeping its config when the
// new file is bad), and stops cleanly when its context ends.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	addrs := make(chan [2]string, 1)
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
			"-reload-interval", "0", "-response-headers", "-call-budget", "5s"}, &logs, hup,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var grpcAddr, httpAddr string
	select {
	case a := <-addrs:
		grpcAddr, httpAddr = a[0], a[1]
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rls.NewRateLimitServiceClient(conn)
	req := &rls.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	codes := func() []rls.RateLimitResponse_Code {
		var got []rls.RateLimitResponse_Code
		for range 3 {
			resp, err := c.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			got = append(got, resp.OverallCode)
		}
		return got
	}
	if got := codes(); got[0] != rls.RateLimitResponse_OK || got[1] != rls.RateLimitResponse_OVER_LIMIT {
		t.Errorf("codes at 1 per hour = %v, want OK then OVER_LIMIT", got)
	}

	// A bad file: the config stays, a log line says why.
	write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: one}")
	hup <- os.Interrupt
	waitFor(t, &logs, "config reload failed")
	// A good one with another key: it applies.
	write("domain: d\ndescriptors:\n  - key: k2\n    rate_limit: {unit: hour, requests_per_unit: 1}")
	hup <- os.Interrupt
	waitFor(t, &logs, "config reloaded")
	if got := codes(); got[0] != rls.RateLimitResponse_OK || got[1] != rls.RateLimitResponse_OK {
		t.Errorf("codes after the rule of k went away = %v, want OK", got)
	}

	hc := healthpb.NewHealthClient(conn)
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, %v; want SERVING", resp, err)
	}
	for path, want := range map[string]string{
		"/healthcheck": "OK",
		"/metrics":     `tierlimit_serve_requests_total{code="over_limit",domain="d"} 2`,
	} {
		body := get(t, "http://"+httpAddr+path)
		if !strings.Contains(body, want) {
			t.Errorf("GET %s = %q, want it to hold %q", path, body, want)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after the context ended: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("run did not stop")
	}
	if !strings.Contains(logs.String(), "stopped") {
		t.Errorf("log = %q, want the shutdown logged", logs.String())
	}
}

func waitFor(t *testing.T, logs *syncBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log: %s", s, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // a substring of the error, "" for none
	}{
		{[]string{"-redis-url", "redis://127.0.0.1:1/0", "-redis-addrs", "a:1"}, nil, "give one"},
		{[]string{"-redis-url", "http://x"}, nil, "-redis-url"},
		{[]string{"-redis-addrs", "a:1,b:2"}, nil, "one address"},
		{[]string{"-redis-addrs", "a:1", "-redis-mode", "sentinel"}, nil, "-redis-master"},
		{[]string{"-redis-addrs", "a:1", "-redis-mode", "ring"}, nil, "want single"},
		{[]string{"-redis-addrs", "a:1,,b:2", "-redis-mode", "cluster"}, nil, "empty address"},
		{[]string{"-redis-addrs", "a:1,b:2", "-redis-mode", "cluster"}, nil, ""},
		{[]string{"-redis-addrs", "s1:26379,s2:26379", "-redis-master", "mymaster"}, nil, ""},
		{nil, map[string]string{"TIERLIMIT_SERVE_REDIS_ADDRS": "a:1,b:2", "TIERLIMIT_SERVE_REDIS_MODE": "cluster"}, ""},
		{[]string{"-redis-mode", "single"}, map[string]string{"TIERLIMIT_SERVE_REDIS_ADDRS": "a:1,b:2"}, "one address"},
		{nil, map[string]string{"TIERLIMIT_SERVE_REDIS_DB": "x"}, "TIERLIMIT_SERVE_REDIS_DB"},
		{[]string{"extra"}, nil, "unexpected"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		f, err := parseFlags(tc.args, io.Discard)
		if err == nil {
			var c *redisConn
			if c, err = openRedis(f); err == nil {
				c.close()
			}
		}
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v %v: %v, want %q", tc.args, tc.env, err, tc.want)
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
}
