package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// TestRun runs the server briefly on the embedded Redis: requests past the
// limit get 429 with Retry-After, every response carries the RateLimit
// fields, /metrics shows the decisions, and cancelling the context shuts
// the server down.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{addr: "127.0.0.1:0", rate: 5, perKey: 3}, func(a string) { addrc <- a })
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run = %v before listening", err)
	}

	get := func(path string, header ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}

	start := time.Now()
	codes := map[int]int{}
	for i := range 20 {
		resp, _ := get("/hello")
		codes[resp.StatusCode]++
		if resp.Header.Get("RateLimit") == "" || resp.Header.Get("RateLimit-Policy") == "" {
			t.Errorf("request %d: RateLimit %q, RateLimit-Policy %q; want both", i+1,
				resp.Header.Get("RateLimit"), resp.Header.Get("RateLimit-Policy"))
		}
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("request %d: 429 without Retry-After", i+1)
		}
	}
	bound := 5 + int(5*time.Since(start).Seconds())
	if codes[http.StatusOK] < 5 || codes[http.StatusOK] > bound || codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("20 requests at 5/s got %v, want 5 to %d admitted and the rest 429", codes, bound)
	}

	// The per-key limit (3 per minute) applies on top, to requests with a
	// key; wait for the per-IP bucket to hold enough first.
	time.Sleep(time.Second)
	var keyCodes []int
	for range 4 {
		resp, _ := get("/hello", "X-API-Key", "k1")
		keyCodes = append(keyCodes, resp.StatusCode)
	}
	if keyCodes[3] != http.StatusTooManyRequests {
		t.Errorf("4 requests with one API key at 3/min got %v, want the 4th refused", keyCodes)
	}

	resp, body := get("/metrics")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	for _, want := range []string{
		`tierlimit_decisions_total{limiter="ip",result="denied",source=`,
		`tierlimit_decisions_total{limiter="key",result="allowed",source="remote"} `,
		`tierlimit_redis_calls_total{limiter="key",op="allow"} `,
		`tierlimit_hybrid_tokens_leased_total{limiter="ip"} `,
		// Its value is not checked: on a loaded machine three calls over
		// the 25 ms budget open the breaker, as they should.
		`tierlimit_breaker_state{limiter="ip",state="closed"} `,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestRunRefusesBadConfig checks that bad flags are errors, not panics.
func TestRunRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  config
		is   error
	}{
		{"rate 0", config{addr: "127.0.0.1:0", rate: 0, perKey: 1}, tierlimit.ErrInvalidLimit},
		{"per-key 0", config{addr: "127.0.0.1:0", rate: 1, perKey: 0}, tierlimit.ErrInvalidLimit},
		{"bad proxy", config{addr: "127.0.0.1:0", rate: 1, perKey: 1, trusted: []string{"not-a-cidr"}}, tierlimit.ErrInvalidOption},
		{"bad Redis URL", config{addr: "127.0.0.1:0", redisURL: "not-a-url", rate: 1, perKey: 1}, nil},
	} {
		err := run(context.Background(), tc.cfg, func(string) { t.Errorf("%s: server started", tc.name) })
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: run = %v, want an error wrapping %v", tc.name, err, tc.is)
		}
	}
}
