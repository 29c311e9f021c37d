// Command grpcserver is a gRPC service limited by tierlimit, with a client
// that retries by itself, to copy from: a hybrid limiter per client
// address behind grpclimit's interceptors, and a grpc-go client whose
// retry policy retries RESOURCE_EXHAUSTED after the server's pushback.
//
// It runs the server on loopback and an embedded Redis (miniredis), then
// sends -calls calls as fast as the server lets it, and prints how long
// each took and how many attempts the server refused:
//
//	cd examples/grpcserver && go run .
//	go run . -rate 5 -calls 12
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/grpclimit"
	"github.com/tierlimit/tierlimit/hybrid"
)

// config is what the flags set.
type config struct {
	rate  int64 // calls per second per client address
	calls int   // calls the client sends
}

// retryPolicy retries RESOURCE_EXHAUSTED: grpc-go then waits the server's
// grpc-retry-pushback-ms trailer before each retry, not its own backoff.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "grpc.health.v1.Health"}],
	"retryPolicy": {
		"maxAttempts": 5,
		"initialBackoff": "0.1s",
		"maxBackoff": "1s",
		"backoffMultiplier": 2,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]
	}
}]}`

func main() {
	var cfg config
	flag.Int64Var(&cfg.rate, "rate", 5, "calls per second per client address")
	flag.IntVar(&cfg.calls, "calls", 10, "calls the client sends")
	flag.Parse()
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves on loopback, sends cfg.calls calls through a retrying
// client, reports to w, and stops the server.
func run(ctx context.Context, cfg config, w io.Writer) error {
	mr, err := miniredis.Run()
	if err != nil {
		return err
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, tierlimit.PerSecond(cfg.rate))
	if err != nil {
		return err
	}
	defer lim.Close()

	var refused atomic.Int64
	in, err := grpclimit.New(lim,
		grpclimit.WithName("per-client"),
		grpclimit.WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
			if !res.Allowed {
				refused.Add(1)
			}
		}))
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	cc, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(retryPolicy))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	start := time.Now()
	for i := 1; i <= cfg.calls; i++ {
		t0 := time.Now()
		before := refused.Load()
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := client.Check(callCtx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		fmt.Fprintf(w, "call %2d: ok in %v, %d attempt(s) refused first\n", i, time.Since(t0).Round(time.Millisecond), refused.Load()-before)
	}
	fmt.Fprintf(w, "%d calls in %v at %d/s per client; the server refused %d attempts, the client retried each after its pushback\n",
		cfg.calls, time.Since(start).Round(time.Millisecond), cfg.rate, refused.Load())
	return nil
}
