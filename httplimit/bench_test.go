package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// constLimiter admits everything with one fixed Result: a limiter that
// costs next to nothing, so that a benchmark measures the middleware.
type constLimiter struct{ res tierlimit.Result }

func (c *constLimiter) AllowN(context.Context, string, int64) (tierlimit.Result, error) {
	return c.res, nil
}

// nopWriter is a ResponseWriter that keeps its header map between
// iterations (cleared, so that its buckets are reused, as a server's fresh
// map would be grown once by the handler anyway).
type nopWriter struct {
	h    http.Header
	code int
}

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(code int)        { w.code = code }

var benchLimiter = &constLimiter{tierlimit.Result{
	Allowed: true, Limit: tierlimit.PerMinute(100), Remaining: 42, ResetAfter: 30 * time.Second,
}}

// benchHandler is what a typical handler does at least: set a header and
// write a body.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok"))
})

// overheadCase is a request BenchmarkOverhead serves: from remote, with
// the header fields in header (name, value, ...), for a middleware built
// with opts that should key it as key.
type overheadCase struct {
	name   string
	remote string
	header []string
	key    string
	opts   []Option
}

var overheadCases = []overheadCase{
	{"peer=ipv4", "192.0.2.1:50000", nil, "192.0.2.1", nil},
	{"peer=ipv6", "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::", nil},
	{"peer=proxy", "10.0.0.1:50000", []string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7",
		[]Option{WithTrustedProxies("10.0.0.0/8")}},
	{"peer=ipv4-legacy", "192.0.2.1:50000", nil, "192.0.2.1", []Option{WithLegacyHeaders()}},
	// A client that reaches the service past its proxies: its header is
	// not believed.
	{"peer=untrusted", "192.0.2.1:50000", []string{"X-Forwarded-For", "198.51.100.7"}, "192.0.2.1",
		[]Option{WithTrustedProxies("10.0.0.0/8")}},
	{"peer=proxy-ipv6", "[2001:db8:ffff::1]:50000",
		[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, 2001:db8:ffff::2"}, "2001:db8:1:2::",
		[]Option{WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48")}},
	{"peer=proxy-forwarded", "10.0.0.1:50000",
		[]string{"Forwarded", "for=198.51.100.7;proto=https, for=10.0.0.2"}, "198.51.100.7",
		[]Option{WithTrustedProxies("10.0.0.0/8"), WithProxyHeader(HeaderForwarded)}},
	{"peer=proxy-forwarded-ipv6", "[2001:db8:ffff::1]:50000",
		[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2::",
		[]Option{WithTrustedProxies("2001:db8:ffff::/48"), WithProxyHeader(HeaderForwarded)}},
}

// setup returns the case's request, a writer, the direct path (the
// limiter, then the handler) and the middleware's handler.
func (tc overheadCase) setup(b *testing.B) (r *http.Request, w *nopWriter, direct func(), limited http.Handler) {
	r = httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = tc.remote
	for i := 0; i+1 < len(tc.header); i += 2 {
		r.Header.Add(tc.header[i], tc.header[i+1])
	}
	w = &nopWriter{h: http.Header{}}
	ctx := r.Context()
	direct = func() {
		res, err := benchLimiter.AllowN(ctx, tc.key, 1)
		if err != nil || !res.Allowed {
			b.Fatalf("AllowN = %+v, %v", res, err)
		}
		benchHandler.ServeHTTP(w, r)
	}
	m, err := New(benchLimiter, tc.opts...)
	if err != nil {
		b.Fatal(err)
	}
	return r, w, direct, m.Handler(benchHandler)
}

// BenchmarkOverhead compares calling the limiter directly and then the
// handler (impl=direct) with the middleware doing the same plus key
// extraction and headers (impl=middleware). Compare them with
//
//	benchstat -col /impl out.txt
//
// BenchmarkOverheadPaired measures the difference less noisily.
func BenchmarkOverhead(b *testing.B) {
	for _, tc := range overheadCases {
		r, w, direct, h := tc.setup(b)
		b.Run(tc.name+"/impl=direct", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				direct()
			}
		})
		b.Run(tc.name+"/impl=middleware", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
			if w.h.Get("RateLimit") == "" {
				b.Fatal("no RateLimit field")
			}
		})
	}
}

// BenchmarkOverheadPaired reports the middleware's overhead per request
// (overhead-ns, overhead-allocs) as the difference between the middleware
// and the direct path of BenchmarkOverhead, timed in alternating batches
// of pairBatch requests: a slow spell of this shared machine, which moved
// BenchmarkOverhead's two halves apart by a factor of 1.7, then falls on
// both alike. The framework's ns/op is a pair of batches.
func BenchmarkOverheadPaired(b *testing.B) {
	const pairBatch = 64
	for _, tc := range overheadCases {
		b.Run(tc.name, func(b *testing.B) {
			r, w, direct, h := tc.setup(b)
			limited := func() { h.ServeHTTP(w, r) }
			var allocs [2]float64
			for i, f := range []func(){direct, limited} {
				allocs[i] = testing.AllocsPerRun(100, func() { clear(w.h); f() })
			}
			var ns [2]time.Duration
			for b.Loop() {
				for i, f := range []func(){direct, limited} {
					t0 := time.Now()
					for range pairBatch {
						clear(w.h)
						f()
					}
					ns[i] += time.Since(t0)
				}
			}
			reqs := float64(b.N * pairBatch)
			b.ReportMetric(float64(ns[0])/reqs, "direct-ns")
			b.ReportMetric(float64(ns[1]-ns[0])/reqs, "overhead-ns")
			b.ReportMetric(allocs[1]-allocs[0], "overhead-allocs")
		})
	}
}

// BenchmarkClientIP resolves the client of each BenchmarkOverhead case
// alone, with the resolver's memos of trusted proxies (memo=on) and
// without (memo=off). Compare with benchstat -col /memo.
func BenchmarkClientIP(b *testing.B) {
	for _, tc := range overheadCases {
		r, _, _, _ := tc.setup(b)
		on := &mustNew(b, benchLimiter, tc.opts...).ip
		off := *on
		off.peers, off.hops = nil, nil
		for _, v := range []struct {
			name string
			rs   *resolver
		}{{"on", on}, {"off", &off}} {
			b.Run(tc.name+"/memo="+v.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if key, _ := v.rs.clientIP(r); key != tc.key {
						b.Fatalf("key %q, want %q", key, tc.key)
					}
				}
			})
		}
	}
}

// BenchmarkOverheadParallel runs the middleware from every core: it keeps
// no shared mutable state, so it should scale as the limiter does.
func BenchmarkOverheadParallel(b *testing.B) {
	m, err := New(benchLimiter)
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler(benchHandler)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.1:50000"
		w := &nopWriter{h: http.Header{}}
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
		}
	})
}
