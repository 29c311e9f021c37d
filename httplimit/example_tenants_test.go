package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/local"
)

// Limit each client IP to 1 MB of uploads and 100 requests a minute with
// one Middleware: the byte limiter is charged each request's content
// length, and the fields say its quota is in content bytes. It is asked
// first, so that an upload it refuses is not charged to the other.
func ExampleWithLimiterCost() {
	reqs, err := local.New(tierlimit.PerMinute(100), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer reqs.Close()
	upload, err := local.New(tierlimit.PerMinute(1_000_000), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer upload.Close()
	mw, err := httplimit.New(upload, httplimit.WithName("upload"),
		httplimit.WithLimiter("requests", reqs, nil), // cost 1: WithCost's default
		httplimit.WithLimiterCost("upload", httplimit.UnitContentBytes, func(r *http.Request) int64 {
			// A body of unknown length (chunked) is refused: it could
			// be of any size.
			if r.ContentLength < 0 {
				return -1
			}
			return r.ContentLength
		}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(hello)

	for _, size := range []int{300_000, 600_000, 200_000} {
		r := httptest.NewRequest(http.MethodPost, "/upload", strings.NewReader(strings.Repeat("x", size)))
		r.RemoteAddr = "192.0.2.1:5000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, "RateLimit:", w.Header().Get("RateLimit"))
		if size == 300_000 {
			fmt.Println("RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
		}
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Println("Retry-After:", ra)
		}
	}
	// Output:
	// 200 RateLimit: "upload:1000000/1m";r=700000;t=1, "requests:100/1m";r=99;t=1
	// RateLimit-Policy: "upload:1000000/1m";q=1000000;qu="content-bytes";w=60, "requests:100/1m";q=100;w=60
	// 200 RateLimit: "upload:1000000/1m";r=100000;t=1, "requests:100/1m";r=98;t=1
	// 429 RateLimit: "upload:1000000/1m";r=100000;t=1, "requests:100/1m";r=98;t=1
	// Retry-After: 6
}

// plans stands in for one limiter built with WithLimitFunc (local, remote
// or hybrid), whose limit depends on the key: here, on the plan of the
// API key.
type plans map[string]*local.Limiter

func (p plans) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	plan := "free"
	if strings.HasPrefix(key, "pro_") {
		plan = "pro"
	}
	return p[plan].AllowN(ctx, key, n)
}

// Limit each API key by its plan, free 2 requests a minute and pro 1,000:
// each key's fields advertise its own quota, from the limit that decided
// its request, and a partition key (an HMAC of the API key, never the key
// itself) tells a client acting for several keys which quota is which.
func Example_perKeyLimit() {
	free, err := local.New(tierlimit.PerMinute(2), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer free.Close()
	pro, err := local.New(tierlimit.PerMinute(1000), local.WithClock(fixedClock{}))
	if err != nil {
		panic(err)
	}
	defer pro.Close()
	secret := []byte("a secret of 32 random bytes, not this sentence") // from your secret store
	mw, err := httplimit.New(plans{"free": free, "pro": pro},
		httplimit.WithName("api"),
		httplimit.WithKey(httplimit.KeyHeader("X-API-Key")),
		httplimit.WithPartitionKey("api", secret))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(hello)

	for i, key := range []string{"free_alice", "pro_bob", "free_alice", "free_alice"} {
		r := httptest.NewRequest(http.MethodGet, "/search", nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if i < 2 {
			fmt.Println(key, "RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
		}
		fmt.Println(key, w.Code, "RateLimit:", w.Header().Get("RateLimit"))
	}
	// Output:
	// free_alice RateLimit-Policy: "api:2/1m";q=2;w=60;pk=:jSIbHU2DnkkyxsiaYBOnBA==:
	// free_alice 200 RateLimit: "api:2/1m";r=1;t=30;pk=:jSIbHU2DnkkyxsiaYBOnBA==:
	// pro_bob RateLimit-Policy: "api:1000/1m";q=1000;w=60;pk=:Eq0cZOInngDFzKR+v4H4TQ==:
	// pro_bob 200 RateLimit: "api:1000/1m";r=999;t=1;pk=:Eq0cZOInngDFzKR+v4H4TQ==:
	// free_alice 200 RateLimit: "api:2/1m";r=0;t=30;pk=:jSIbHU2DnkkyxsiaYBOnBA==:
	// free_alice 429 RateLimit: "api:2/1m";r=0;t=30;pk=:jSIbHU2DnkkyxsiaYBOnBA==:
}

// A handler that decides itself, a user and their org all or nothing with
// AllowAll, writes the fields of its own Result with SetHeaders: they
// replace the ones the middleware in front wrote for its per-IP limiter.
func ExampleSetHeaders() {
	perIP, _ := local.New(tierlimit.PerSecond(1000))
	defer perIP.Close()
	tenants, _ := local.New(tierlimit.PerMinute(2))
	defer tenants.Close()
	mw, _ := httplimit.New(perIP, httplimit.WithName("ip"))
	handler := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := tenants.AllowAll(r.Context(),
			tierlimit.Take{Key: "user:42", N: 1}, tierlimit.Take{Key: "org:7", N: 1})
		if err != nil {
			http.Error(w, "limiter error", http.StatusInternalServerError)
			return
		}
		httplimit.SetHeaders(w.Header(), httplimit.Policy{Name: "tenant"}, res)
		if !res.Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "tenant:2/1m";r=1;t=30 Retry-After: ""
	// 200 RateLimit: "tenant:2/1m";r=0;t=30 Retry-After: ""
	// 429 RateLimit: "tenant:2/1m";r=0;t=30 Retry-After: "30"
}
