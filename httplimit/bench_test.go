package httplimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
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
// with opts that should key it as key. client is the client's address as
// the request writes it, which manyClients varies.
type overheadCase struct {
	name   string
	remote string
	header []string
	client string
	key    string
	opts   []Option
}

var overheadCases = []overheadCase{
	{"peer=ipv4", "192.0.2.1:50000", nil, "192.0.2.1", "192.0.2.1", nil},
	{"peer=ipv6", "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::", nil},
	{"peer=proxy", "10.0.0.1:50000", []string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7", "198.51.100.7",
		[]Option{WithTrustedProxies("10.0.0.0/8")}},
	{"peer=ipv4-legacy", "192.0.2.1:50000", nil, "192.0.2.1", "192.0.2.1", []Option{WithLegacyHeaders()}},
	// A client that reaches the service past its proxies: its header is
	// not believed.
	{"peer=untrusted", "192.0.2.1:50000", []string{"X-Forwarded-For", "198.51.100.7"}, "192.0.2.1", "192.0.2.1",
		[]Option{WithTrustedProxies("10.0.0.0/8")}},
	{"peer=proxy-ipv6", "[2001:db8:ffff::1]:50000",
		[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, 2001:db8:ffff::2"}, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::",
		[]Option{WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48")}},
	{"peer=proxy-forwarded", "10.0.0.1:50000",
		[]string{"Forwarded", "for=198.51.100.7;proto=https, for=10.0.0.2"}, "198.51.100.7", "198.51.100.7",
		[]Option{WithTrustedProxies("10.0.0.0/8"), WithProxyHeader(HeaderForwarded)}},
	{"peer=proxy-forwarded-ipv6", "[2001:db8:ffff::1]:50000",
		[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::",
		[]Option{WithTrustedProxies("2001:db8:ffff::/48"), WithProxyHeader(HeaderForwarded)}},
	// Requests and bytes in one Middleware, each with a partition key:
	// two limiters, two RateLimit items, two HMACs. (The direct path asks
	// the limiter once: the second call is part of the overhead.)
	{"peer=ipv4-bytes-pk", "192.0.2.1:50000", nil, "192.0.2.1", "192.0.2.1", []Option{
		WithPartitionKey("default", benchSecret),
		WithLimiter("bytes", benchBytes, nil), WithPartitionKey("bytes", benchSecret),
		WithLimiterCost("bytes", UnitContentBytes, func(r *http.Request) int64 { return max(r.ContentLength, 0) })}},
}

// benchBytes is the byte limiter of the peer=ipv4-bytes-pk case.
var benchBytes = &constLimiter{tierlimit.Result{
	Allowed: true, Limit: tierlimit.PerSecond(10_000_000), Remaining: 9_999_000, ResetAfter: 100 * time.Microsecond,
}}

var benchSecret = []byte("0123456789abcdef0123456789abcdef")

// manyClients is the number of clients of the clients=many and
// clients=zipf benchmarks: enough that their strings do not all stay in
// the CPU's caches.
const manyClients = 4096

// clients returns n variants of tc, each from another client (the same
// one if n is 1): another /64 for IPv6.
func (tc overheadCase) clients(n int) []overheadCase {
	out := make([]overheadCase, n)
	for i := range out {
		v := tc
		if n > 1 {
			if strings.Contains(tc.client, ":") {
				v.client = fmt.Sprintf("2001:db8:%x:2:3:4:5:6", i+1)
				v.key = fmt.Sprintf("2001:db8:%x:2::", i+1)
			} else {
				v.client = fmt.Sprintf("198.18.%d.%d", i>>8, i&0xff)
				v.key = v.client
			}
			v.remote = strings.Replace(tc.remote, tc.client, v.client, 1)
			v.header = slices.Clone(tc.header)
			for j := 1; j < len(v.header); j += 2 {
				v.header[j] = strings.Replace(v.header[j], tc.client, v.client, 1)
			}
		}
		out[i] = v
	}
	return out
}

// bench is what a benchmark of one case runs: the middleware's handler
// and the direct path (the limiter, then the handler), for requests from
// one or many clients in turn. The requests are one, rewritten for each
// client: a server resolves a request it has just read, whose fields are
// in the CPU's caches, and thousands of stored requests would not be.
type bench struct {
	r       *http.Request
	line    []string // r's proxy header field, if any
	clients []overheadCase
	order   []int // indexes of clients, in the order they send requests
	w       *nopWriter
	limited http.Handler
	i       int
	sink    byte
}

// setup returns the bench of tc with the clients of mix.
func (tc overheadCase) setup(tb testing.TB, mix clientMix) *bench {
	m, err := New(benchLimiter, tc.opts...)
	if err != nil {
		tb.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	bn := &bench{r: r, clients: tc.clients(mix.n), order: mix.order(), w: &nopWriter{h: http.Header{}}, limited: m.Handler(benchHandler)}
	if len(tc.header) == 2 {
		bn.line = []string{tc.header[1]}
		r.Header[http.CanonicalHeaderKey(tc.header[0])] = bn.line
	}
	return bn
}

// next returns the next client's request and its key.
func (bn *bench) next() (*http.Request, string) {
	c := &bn.clients[bn.order[bn.i]]
	if bn.i++; bn.i == len(bn.order) {
		bn.i = 0
	}
	bn.r.RemoteAddr = c.remote
	if bn.line != nil {
		bn.line[0] = c.header[1]
	}
	// A server has just written the request's strings: bring them into
	// the caches, for both paths alike.
	bn.sink += touch(c.remote) + touch(c.key)
	if bn.line != nil {
		bn.sink += touch(bn.line[0])
	}
	return bn.r, c.key
}

// touch reads every byte of s.
func touch(s string) byte {
	var x byte
	for i := 0; i < len(s); i++ {
		x ^= s[i]
	}
	return x
}

// direct serves the next request without the middleware.
func (bn *bench) direct() {
	r, key := bn.next()
	clear(bn.w.h)
	res, err := benchLimiter.AllowN(r.Context(), key, 1)
	if err != nil || !res.Allowed {
		panic(fmt.Sprintf("AllowN = %+v, %v", res, err))
	}
	benchHandler.ServeHTTP(bn.w, r)
}

// serve serves the next request through the middleware.
func (bn *bench) serve() {
	r, _ := bn.next()
	clear(bn.w.h)
	bn.limited.ServeHTTP(bn.w, r)
}

// allocs returns the average number of allocations of f over runs calls
// (testing.AllocsPerRun truncates it to an integer).
func allocs(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// clientMix is who sends the requests of a benchmark: n clients, with
// Zipf-distributed request counts if zipf, else in turn.
type clientMix struct {
	name string
	n    int
	zipf bool
}

// order returns the indexes of the clients that send the requests, in
// turn: a fixed sequence, so that runs compare.
func (mix clientMix) order() []int {
	if !mix.zipf {
		out := make([]int, mix.n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), zipfS, 1, uint64(mix.n-1))
	out := make([]int, 16*mix.n)
	for i := range out {
		out[i] = int(z.Uint64())
	}
	return out
}

// zipfS is the exponent of the Zipf distribution of clients=zipf: web
// traffic by client is heavy-tailed, its exponent near 1. With 1.1, the
// 32 busiest of 4,096 clients send 57% of the requests.
const zipfS = 1.1

// clientMixes are the clients= dimension of the overhead benchmarks: one
// client; manyClients in turn; or manyClients sending Zipf-distributed
// numbers of requests.
var clientMixes = []clientMix{{"one", 1, false}, {"many", manyClients, false}, {"zipf", manyClients, true}}

// BenchmarkOverhead compares calling the limiter directly and then the
// handler (impl=direct) with the middleware doing the same plus key
// extraction and headers (impl=middleware). Compare them with
//
//	benchstat -col /impl out.txt
//
// BenchmarkOverheadPaired measures the difference less noisily.
func BenchmarkOverhead(b *testing.B) {
	for _, tc := range overheadCases {
		for _, cc := range clientMixes {
			bn := tc.setup(b, cc)
			b.Run(tc.name+"/clients="+cc.name+"/impl=direct", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					bn.direct()
				}
			})
			b.Run(tc.name+"/clients="+cc.name+"/impl=middleware", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					bn.serve()
				}
				if bn.w.h.Get("RateLimit") == "" {
					b.Fatal("no RateLimit field")
				}
			})
		}
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
		for _, cc := range clientMixes {
			b.Run(tc.name+"/clients="+cc.name, func(b *testing.B) {
				bn := tc.setup(b, cc)
				paths := []func(){bn.direct, bn.serve}
				var as [2]float64
				for i, f := range paths {
					as[i] = allocs(2*manyClients, f)
				}
				var ns [2]time.Duration
				for b.Loop() {
					for i, f := range paths {
						t0 := time.Now()
						for range pairBatch {
							f()
						}
						ns[i] += time.Since(t0)
					}
				}
				reqs := float64(b.N * pairBatch)
				b.ReportMetric(float64(ns[0])/reqs, "direct-ns")
				b.ReportMetric(float64(ns[1]-ns[0])/reqs, "overhead-ns")
				b.ReportMetric(as[1]-as[0], "overhead-allocs")
			})
		}
	}
}

// TestMiddlewareAllocs holds every case of BenchmarkOverhead to the
// middleware's allocation bar, at most 3 per request on top of the limiter
// and the handler, counted as BenchmarkOverheadPaired counts them.
func TestMiddlewareAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	const bar = 3.01 // a stray allocation of the runtime's, now and then
	for _, tc := range overheadCases {
		for _, cc := range clientMixes {
			t.Run(tc.name+"/clients="+cc.name, func(t *testing.T) {
				bn := tc.setup(t, cc)
				got := allocs(2*manyClients, bn.serve) - allocs(2*manyClients, bn.direct)
				if got > bar {
					t.Errorf("%.3f allocations per request on top of the limiter, want at most 3", got)
				}
			})
		}
	}
}

// BenchmarkClientIP resolves the client of each BenchmarkOverhead case
// alone.
func BenchmarkClientIP(b *testing.B) {
	for _, tc := range overheadCases {
		for _, cc := range clientMixes {
			bn := tc.setup(b, cc)
			rs := &mustNew(b, benchLimiter, tc.opts...).ip
			b.Run(tc.name+"/clients="+cc.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					r, want := bn.next()
					if key, _ := rs.clientIP(r); key != want {
						b.Fatalf("key %q, want %q", key, want)
					}
				}
			})
		}
	}
}

// BenchmarkLongHeader serves requests from a trusted proxy with a proxy
// header of 1 MiB (longHeaders) through the middleware, with
// BenchmarkOverhead's limiter and handler.
func BenchmarkLongHeader(b *testing.B) {
	for _, tc := range longHeaders() {
		b.Run(tc.name, func(b *testing.B) {
			m := mustNew(b, benchLimiter, WithTrustedProxies("10.0.0.0/8"), WithProxyHeader(tc.header))
			h := m.Handler(benchHandler)
			r := request("10.0.0.1:443")
			r.Header[tc.header] = []string{tc.line}
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
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
