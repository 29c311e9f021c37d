package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/local"
)

// fixedClock stops time, so that the examples print the same headers on
// every run.
type fixedClock struct{}

func (fixedClock) Now() time.Time { return time.Unix(1_700_000_000, 0) }

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, "hello")
})

// get sends one request from remoteAddr through h and prints the answer.
func get(h http.Handler, remoteAddr string, header ...string) {
	r := httptest.NewRequest(http.MethodGet, "/search", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%d RateLimit: %s", w.Code, w.Header().Get("RateLimit"))
	if ra := w.Header().Get("Retry-After"); ra != "" {
		fmt.Printf(" Retry-After: %s", ra)
	}
	fmt.Println()
}

// Limit each client IP to 2 requests per minute.
func ExampleNew() {
	lim, err := local.New(tierlimit.PerMinute(2), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	mw, err := httplimit.New(lim)
	if err != nil {
		panic(err)
	}
	h := mw.Handler(hello)

	get(h, "192.0.2.1:5000")
	get(h, "192.0.2.1:5001")
	get(h, "192.0.2.1:5002")
	get(h, "198.51.100.9:5000") // another client
	r := httptest.NewRecorder()
	h.ServeHTTP(r, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println("RateLimit-Policy:", r.Header().Get("RateLimit-Policy"))
	// Output:
	// 200 RateLimit: "default:2/1m";r=1;t=30
	// 200 RateLimit: "default:2/1m";r=0;t=30
	// 429 RateLimit: "default:2/1m";r=0;t=30 Retry-After: 30
	// 200 RateLimit: "default:2/1m";r=1;t=30
	// RateLimit-Policy: "default:2/1m";q=2;w=60
}

// Behind a load balancer at 10.0.0.0/8, limit by the client it names in
// X-Forwarded-For. Addresses the client wrote itself, left of the one the
// balancer appended, are not believed.
func ExampleWithTrustedProxies() {
	lim, err := local.New(tierlimit.PerMinute(1), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	mw, err := httplimit.New(lim, httplimit.WithTrustedProxies("10.0.0.0/8"))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(hello)

	get(h, "10.1.1.1:80", "X-Forwarded-For", "203.0.113.5")
	get(h, "10.1.1.1:80", "X-Forwarded-For", "198.51.100.1, 203.0.113.5") // spoofed: still 203.0.113.5
	get(h, "10.1.1.1:80", "X-Forwarded-For", "203.0.113.6")
	// Output:
	// 200 RateLimit: "default:1/1m";r=0;t=60
	// 429 RateLimit: "default:1/1m";r=0;t=60 Retry-After: 60
	// 200 RateLimit: "default:1/1m";r=0;t=60
}

// Limit a route per client IP and, for requests with an API key, per key
// too. The RateLimit field reports the most restrictive of the two; a
// request the route's limit denies is not charged to the key.
func ExampleWithLimiter() {
	route, err := local.New(tierlimit.PerSecond(10), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer route.Close()
	perKey, err := local.New(tierlimit.PerHour(2), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer perKey.Close()
	mw, err := httplimit.New(route, httplimit.WithName("search"),
		httplimit.WithLimiter("per-key", perKey, httplimit.KeyHeader("X-API-Key")))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /search", mw.Handler(hello))

	for range 3 {
		get(mux, "192.0.2.1:5000", "X-API-Key", "k1")
	}
	// Output:
	// 200 RateLimit: "per-key:2/1h";r=1;t=1800
	// 200 RateLimit: "per-key:2/1h";r=0;t=1800
	// 429 RateLimit: "per-key:2/1h";r=0;t=1800 Retry-After: 1800
}
