package httplimit

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// contentLength is a byte cost: the request's declared content length.
func contentLength(r *http.Request) int64 { return max(r.ContentLength, 0) }

// TestLimiterCost checks that each limiter is charged its own cost, in its
// own unit, and that the fields say so.
func TestLimiterCost(t *testing.T) {
	reqs := newFake(tierlimit.PerMinute(10), 6*time.Second, time.Minute)
	bytes := newFake(tierlimit.PerMinute(1000), 30*time.Second, time.Minute)
	var errs []error
	m := mustNew(t, reqs, WithName("requests"),
		WithLimiter("bytes", bytes, nil),
		WithLimiterCost("bytes", UnitContentBytes, contentLength),
		WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))
	const ip = "192.0.2.1"
	for i, tc := range []struct {
		size         int64
		code         int
		reqs, bytes  int64 // charged after the request
		policy       string
		rateLimit    string
		retryAfter   string
		lastBytesAsk int64
	}{
		{400, 200, 1, 400,
			`"requests:10/1m";q=10;w=60, "bytes:1000/1m";q=1000;qu="content-bytes";w=60`,
			`"requests:10/1m";r=9;t=60, "bytes:1000/1m";r=600;t=60`, "", 400},
		{500, 200, 2, 900,
			`"requests:10/1m";q=10;w=60, "bytes:1000/1m";q=1000;qu="content-bytes";w=60`,
			`"requests:10/1m";r=8;t=60, "bytes:1000/1m";r=100;t=60`, "", 500},
		// Too many bytes: the request limiter keeps its charge (it was
		// asked first), the byte limiter denies.
		{200, 429, 3, 900,
			`"requests:10/1m";q=10;w=60, "bytes:1000/1m";q=1000;qu="content-bytes";w=60`,
			`"requests:10/1m";r=7;t=60, "bytes:1000/1m";r=100;t=30`, "30", 200},
		// A cost the byte limiter can never admit: denied, no Retry-After.
		{5000, 429, 4, 900,
			`"requests:10/1m";q=10;w=60`,
			`"requests:10/1m";r=6;t=60, "bytes";r=0`, "", 5000},
	} {
		r := request(ip + ":1")
		r.ContentLength = tc.size
		w := serve(m, r)
		if w.Code != tc.code || reqs.charged(ip) != tc.reqs || bytes.charged(ip) != tc.bytes {
			t.Errorf("request %d of %d bytes: got %d, charged %d requests, %d bytes; want %d, %d, %d",
				i+1, tc.size, w.Code, reqs.charged(ip), bytes.charged(ip), tc.code, tc.reqs, tc.bytes)
		}
		checkField(t, w.Header(), "RateLimit-Policy", tc.policy)
		checkField(t, w.Header(), "RateLimit", tc.rateLimit)
		if got := w.Header().Get("Retry-After"); got != tc.retryAfter {
			t.Errorf("request %d: Retry-After = %q, want %q", i+1, got, tc.retryAfter)
		}
		if calls := bytes.asked(); calls[len(calls)-1].n != tc.lastBytesAsk {
			t.Errorf("request %d: byte limiter asked %v, want cost %d", i+1, calls[len(calls)-1], tc.lastBytesAsk)
		}
		for _, c := range reqs.asked() {
			if c.n != 1 {
				t.Fatalf("request limiter asked %v, want cost 1 (the default)", c)
			}
		}
	}
	if len(errs) != 1 || !errors.Is(errs[0], tierlimit.ErrInvalidCost) {
		t.Errorf("error func saw %v, want one ErrInvalidCost", errs)
	}
}

// TestLimiterCostDefaults checks how WithLimiterCost and WithCost combine:
// WithCost is the cost of the limiters without their own, and is not
// asked when every limiter has its own; the limiter given to New takes
// its cost by its name, whichever option comes first; a limiter that only
// peeks after a denial is asked 0, without calling its cost func.
func TestLimiterCostDefaults(t *testing.T) {
	header := func(name string) func(*http.Request) int64 {
		return func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get(name), 10, 64)
			return n
		}
	}
	for _, tc := range []struct {
		name        string
		opts        []Option
		firstDenies bool
		want        []int64 // costs asked of a, b and c
		defaultAsks int     // calls of the WithCost func
	}{
		{"default cost 1", nil, false, []int64{1, 1, 1}, 0},
		{"WithCost for all", []Option{WithCost(header("X-Default"))}, false, []int64{7, 7, 7}, 1},
		{"b has its own", []Option{WithCost(header("X-Default")), WithLimiterCost("b", "tokens", header("X-B"))}, false, []int64{7, 3, 7}, 1},
		{"the first by its name, before WithName", []Option{WithLimiterCost("a", UnitRequests, header("X-B")), WithCost(header("X-Default"))}, false, []int64{3, 7, 7}, 1},
		{"all have their own", []Option{WithCost(header("X-Default")), WithLimiterCost("a", UnitRequests, header("X-B")),
			WithLimiterCost("b", UnitRequests, header("X-B")), WithLimiterCost("c", UnitRequests, header("X-B"))}, false, []int64{3, 3, 3}, 0},
		{"peeks after a denial", []Option{WithLimiterCost("b", "tokens", header("X-B")), WithLimiterCost("c", "tokens", header("X-Panic"))}, true, []int64{1, 0, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFake(tierlimit.PerMinute(10), time.Second, time.Second)
			b := newFake(tierlimit.PerMinute(10), time.Second, time.Second)
			c := newFake(tierlimit.PerMinute(10), time.Second, time.Second)
			if tc.firstDenies {
				a.used["192.0.2.1"] = 10
			}
			calls := 0
			opts := append([]Option{WithLimiter("b", b, nil), WithLimiter("c", c, nil)}, tc.opts...)
			m := mustNew(t, a, append(opts, WithName("a"))...)
			r := request("192.0.2.1:1", "X-Default", "7", "X-B", "3")
			if m.cost != nil {
				f := m.cost
				m.cost = func(r *http.Request) int64 { calls++; return f(r) }
			}
			for _, ru := range m.rules {
				if ru.cost != nil && ru.name == "c" && tc.firstDenies {
					ru.cost = func(*http.Request) int64 { t.Fatal("cost func of a peeking limiter called"); return 0 }
				}
			}
			serve(m, r)
			for i, f := range []*fakeLimiter{a, b, c} {
				if got := f.asked(); len(got) != 1 || got[0].n != tc.want[i] {
					t.Errorf("limiter %c asked %v, want one call of cost %d", 'a'+i, got, tc.want[i])
				}
			}
			if calls != tc.defaultAsks {
				t.Errorf("WithCost func called %d times, want %d", calls, tc.defaultAsks)
			}
		})
	}
}
