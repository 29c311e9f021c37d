// Command httpserver is an HTTP API limited by tierlimit, to copy from: a
// hybrid limiter per client IP and a remote one per API key, behind the
// httplimit middleware, with Prometheus metrics on /metrics.
//
// It runs on an embedded Redis (miniredis, in process, on loopback) unless
// -redis names a real one:
//
//	go run ./examples/httpserver
//	go run ./examples/httpserver -redis redis://127.0.0.1:6379/0 -rate 100
//
// Then:
//
//	curl -i http://127.0.0.1:8080/hello                      # RateLimit fields; 429 past the limit
//	curl -i -H 'X-API-Key: k1' http://127.0.0.1:8080/hello   # also limited per key
//	curl -s http://127.0.0.1:8080/metrics | grep ^tierlimit_
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/metrics"
	"github.com/tierlimit/tierlimit/remote"
)

// config is what the flags set.
type config struct {
	addr     string   // where to listen
	redisURL string   // "" for an embedded Redis
	rate     int64    // requests per second per client IP
	perKey   int64    // requests per minute per API key
	shadow   bool     // count and set headers, never refuse
	trusted  []string // proxies whose X-Forwarded-For is believed
}

func main() {
	var cfg config
	var trusted string
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "listen address")
	flag.StringVar(&cfg.redisURL, "redis", "", "Redis URL (default: an embedded Redis)")
	flag.Int64Var(&cfg.rate, "rate", 10, "requests per second per client IP")
	flag.Int64Var(&cfg.perKey, "per-key", 600, "requests per minute per X-API-Key")
	flag.BoolVar(&cfg.shadow, "shadow", false, "shadow mode: decide and set headers, never refuse")
	flag.StringVar(&trusted, "trusted-proxies", "", "comma-separated CIDRs of proxies whose X-Forwarded-For is believed")
	flag.Parse()
	if trusted != "" {
		cfg.trusted = strings.Split(trusted, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, cfg, func(addr string) { log.Printf("listening on http://%s (try /hello and /metrics)", addr) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpserver:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then shuts down gracefully. ready is told
// the address once the server listens.
func run(ctx context.Context, cfg config, ready func(addr string)) error {
	opts, stopRedis, err := redisOptions(cfg.redisURL)
	if err != nil {
		return err
	}
	defer stopRedis()
	// Lets the hybrid tier's per-call budget cut a stalled call short, and
	// makes a call against a dead Redis fail at once rather than after
	// go-redis's dial retries (see docs/operations.md).
	opts.ContextTimeoutEnabled = true
	opts.DialerRetries, opts.DialerRetryTimeout = 1, time.Microsecond
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	col, err := metrics.New()
	if err != nil {
		return err
	}
	if err := registerAll(reg, col, collectors.NewGoCollector()); err != nil {
		return err
	}

	perIP, err := hybrid.New(rdb, tierlimit.PerSecond(cfg.rate), hybrid.WithObserver(col.Observer("ip")))
	if err != nil {
		return fmt.Errorf("-rate: %w", err)
	}
	defer perIP.Close() // refunds unspent leased tokens
	if err := col.WatchHybrid("ip", perIP); err != nil {
		return err
	}
	perKey, err := remote.NewGCRA(rdb, tierlimit.PerMinute(cfg.perKey), remote.WithObserver(col.Observer("key")))
	if err != nil {
		return fmt.Errorf("-per-key: %w", err)
	}

	mwOpts := []httplimit.Option{
		httplimit.WithName("ip"),
		httplimit.WithLimiter("key", perKey, httplimit.KeyHeader("X-API-Key")),
		httplimit.WithErrorFunc(func(r *http.Request, err error) { log.Printf("%s %s: %v", r.Method, r.URL.Path, err) }),
	}
	if len(cfg.trusted) > 0 {
		mwOpts = append(mwOpts, httplimit.WithTrustedProxies(cfg.trusted...))
	}
	if cfg.shadow {
		mwOpts = append(mwOpts, httplimit.WithShadow())
	}
	mw, err := httplimit.New(perIP, mwOpts...)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /hello", mw.Handler(http.HandlerFunc(hello)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // not limited: scrapers must get through
	return serve(ctx, cfg.addr, mux, ready)
}

func hello(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "hello\n")
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// serve runs an http.Server on addr until ctx is done.
func serve(ctx context.Context, addr string, h http.Handler, ready func(string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready(ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// redisOptions returns client options for url, or starts an embedded Redis
// on loopback.
func redisOptions(url string) (*redis.Options, func(), error) {
	if url != "" {
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis: %w", err)
		}
		return o, func() {}, nil
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, nil, err
	}
	return &redis.Options{Addr: m.Addr()}, m.Close, nil
}
