package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/serve"
)

//go:embed example.yaml
var exampleConfig []byte

// ready receives the addresses the command listens on, once it serves.
type ready func(grpcAddr, httpAddr string)

// run is the command: it serves until ctx ends, reloading the config on
// each value from hup.
func run(ctx context.Context, args []string, stderr io.Writer, hup <-chan os.Signal, onReady ready) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, f.logFormat)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(f, stderr)
	if err != nil {
		return err
	}
	conn, err := openRedis(f)
	if err != nil {
		return err
	}
	defer conn.close()
	log.Info("redis", "server", conn.desc)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts := []serve.Option{serve.WithLogger(log), serve.WithRegisterer(reg),
		serve.WithHybridOptions(hybrid.WithCallBudget(f.callBudget))}
	if f.shadow {
		opts = append(opts, serve.WithShadowMode())
	}
	if f.headers {
		opts = append(opts, serve.WithResponseHeaders(serve.HeaderNames{Limit: f.limitHeader, Remaining: f.remainHeader, Reset: f.resetHeader}))
	}
	srv, err := serve.New(cfg, conn.rdb, opts...)
	if err != nil {
		return err
	}
	defer srv.Close()

	glis, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	health := srv.Register(g)
	gerr := make(chan error, 1)
	go func() { gerr <- g.Serve(glis) }()

	var hsrv *http.Server
	httpAddr := ""
	herr := make(chan error, 1)
	if f.httpAddr != "" {
		hlis, err := net.Listen("tcp", f.httpAddr)
		if err != nil {
			g.Stop()
			return err
		}
		httpAddr = hlis.Addr().String()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, r *http.Request) {
			resp, err := health.Check(r.Context(), &healthpb.HealthCheckRequest{Service: serve.ServiceName})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				http.Error(w, "NOT_SERVING", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "OK")
		})
		hsrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { herr <- hsrv.Serve(hlis) }()
	}
	log.Info("serving", "grpc", glis.Addr().String(), "http", httpAddr, "domains", cfg.Domains())
	if onReady != nil {
		onReady(glis.Addr().String(), httpAddr)
	}

	var reloader *serve.Reloader
	var tick <-chan time.Time
	if f.config != "" {
		reloader = serve.NewReloader(srv, f.config)
		if f.reloadInterval > 0 {
			t := time.NewTicker(f.reloadInterval)
			defer t.Stop()
			tick = t.C
		}
	}
	for {
		select {
		case <-ctx.Done():
			return shutdown(log, f.shutdown, g, health.Shutdown, hsrv, srv)
		case <-hup:
			if reloader == nil {
				log.Info("SIGHUP: no -config to reload")
				continue
			}
			if err := reloader.Reload(); errors.Is(err, serve.ErrUnchanged) {
				log.Info("SIGHUP: config unchanged", "path", f.config)
			}
		case <-tick:
			reloader.Reload()
		case err := <-gerr:
			return fmt.Errorf("grpc server: %w", err)
		case err := <-herr:
			g.Stop()
			return fmt.Errorf("http server: %w", err)
		}
	}
}

func loadConfig(f *flags, stderr io.Writer) (*serve.Config, error) {
	if f.config == "" {
		fmt.Fprintf(stderr, "no -config: serving this example config\n\n%s\n", exampleConfig)
		return serve.ParseConfig(serve.File{Name: "example.yaml", Data: exampleConfig})
	}
	return serve.LoadConfig(f.config)
}

// shutdown turns health checks to NOT_SERVING, lets the requests in flight
// finish (at most timeout), then gives the tokens held back to Redis.
func shutdown(log *slog.Logger, timeout time.Duration, g *grpc.Server, notServing func(), hsrv *http.Server, srv *serve.Server) error {
	log.Info("shutting down")
	notServing()
	done := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		log.Warn("requests still in flight at the shutdown timeout: stopping", "timeout", timeout)
		g.Stop()
		<-done
	}
	if hsrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		hsrv.Shutdown(ctx)
	}
	err := srv.Close()
	st := srv.Stats()
	log.Info("stopped", "tokens_refunded", st.Refunded, "tokens_lost", st.Lost, "tokens_held", st.Held)
	return err
}
