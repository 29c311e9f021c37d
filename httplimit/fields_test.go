package httplimit

import (
	"bytes"
	"errors"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// TestSetHeaders: a handler that decides itself writes the fields of its
// Result, and they replace whatever another limiter wrote before (a
// Middleware in front of it): a 429 never shows another limiter's r.
func TestSetHeaders(t *testing.T) {
	plan := tierlimit.PerMinute(600)
	tests := []struct {
		name   string
		p      Policy
		res    tierlimit.Result
		fields map[string]string // "" for absent
	}{
		{"allowed", Policy{Name: "org"},
			tierlimit.Result{Allowed: true, Limit: plan, Remaining: 7, ResetAfter: 59300 * time.Millisecond},
			map[string]string{"RateLimit-Policy": `"org:600/1m";q=600;w=60`, "RateLimit": `"org:600/1m";r=7;t=1`,
				"Retry-After": "", "X-RateLimit-Remaining": ""}},
		{"denied", Policy{Name: "org"},
			tierlimit.Result{Limit: plan, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Minute},
			map[string]string{"RateLimit-Policy": `"org:600/1m";q=600;w=60`, "RateLimit": `"org:600/1m";r=0;t=1`,
				"Retry-After": "3"}},
		{"blocked", Policy{Name: "org"},
			tierlimit.Result{Limit: tierlimit.Blocked, Source: tierlimit.SourceBlocked},
			map[string]string{"RateLimit-Policy": "", "RateLimit": `"org";r=0`, "Retry-After": ""}},
		{"tokens, legacy", Policy{Name: "llm", Unit: "tokens", Legacy: true},
			tierlimit.Result{Allowed: true, Limit: tierlimit.PerSecond(1000).WithBurst(5000), Remaining: 4000, ResetAfter: time.Second},
			map[string]string{"RateLimit-Policy": `"llm:1000/1s burst 5000";q=1000;qu="tokens";w=1;tierlimit-burst=5000`,
				"RateLimit": `"llm:1000/1s burst 5000";r=1000;t=1`, "Retry-After": "",
				"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4000", "X-RateLimit-Reset": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// What a Middleware in front wrote for another limiter.
			h := http.Header{}
			h.Set("RateLimit-Policy", `"ip:1000/1s";q=1000;w=1`)
			h.Set("RateLimit", `"ip:1000/1s";r=189;t=1`)
			h.Set("Retry-After", "9")
			h.Set("X-RateLimit-Remaining", "189")
			if err := SetHeaders(h, tt.p, tt.res); err != nil {
				t.Fatalf("SetHeaders = %v", err)
			}
			for name, want := range tt.fields {
				if got := strings.Join(h.Values(name), ", "); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
	h := http.Header{"Ratelimit": {"kept"}}
	for _, p := range []Policy{{Name: ""}, {Name: "a\nb"}, {Name: "ok", Unit: strings.Repeat("u", 40)}} {
		if err := SetHeaders(h, p, tierlimit.Result{}); !errors.Is(err, tierlimit.ErrInvalidOption) || h.Get("RateLimit") != "kept" {
			t.Errorf("SetHeaders(%+v) = %v, RateLimit %q; want ErrInvalidOption, h unchanged", p, err, h.Get("RateLimit"))
		}
	}
}

// TestBurstAdvertised: a limit whose burst exceeds its rate advertises the
// burst in its policy (tierlimit-burst), and r never exceeds q.
func TestBurstAdvertised(t *testing.T) {
	lim, err := local.New(tierlimit.PerSecond(10).WithBurst(30))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	m := mustNew(t, lim)
	w := serve(m, request("192.0.2.1:1"))
	checkField(t, w.Header(), "RateLimit-Policy", `"default:10/1s burst 30";q=10;tierlimit-burst=30;w=1`)
	for _, it := range parseField(t, w.Header(), "RateLimit") {
		if r := it.params["r"].(int64); r > 10 {
			t.Errorf("RateLimit %s: r = %d, want at most q = 10", it, r)
		}
	}
}

// TestCostAboveBurstLogged: a cost above the burst is logged as what it
// is, a 429 for a request no wait admits, not as a limiter failure.
func TestCostAboveBurstLogged(t *testing.T) {
	var buf bytes.Buffer
	log.SetOutput(&buf)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	lim := newFake(tierlimit.PerMinute(10), time.Second, time.Minute)
	m := mustNew(t, lim, WithCost(func(*http.Request) int64 { return 11 }))
	if w := serve(m, request("192.0.2.1:1")); w.Code != http.StatusTooManyRequests {
		t.Errorf("cost 11 of a burst of 10: got %d, want 429", w.Code)
	}
	got := buf.String()
	for _, want := range []string{"refused with 429", "cost 11 is more than the key's burst"} {
		if !strings.Contains(got, want) {
			t.Errorf("log line %q: want it to say %q", got, want)
		}
	}
	if strings.Contains(got, "failing open") {
		t.Errorf("log line %q says failing open; the request was refused", got)
	}
}
