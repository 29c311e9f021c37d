package main

import (
	"github.com/tierlimit/tierlimit"
	"testing"
	"time"
)

// TestRun runs the quickstart briefly on the embedded Redis and checks that
// bad flags are refused.
func TestRun(t *testing.T) {
	if err := run("", 300*time.Millisecond, 200); err != nil {
		t.Fatalf("run = %v", err)
	}
	for _, bad := range []struct {
		url string
		d   time.Duration
		r   int64
	}{{"", 0, 10}, {"", time.Second, 0}, {"not-a-url", time.Second, 10}} {
		if err := run(bad.url, bad.d, bad.r); err == nil {
			t.Errorf("run(%q, %v, %d) = nil, want an error", bad.url, bad.d, bad.r)
		}
	}
}

// TestFleetHybridWithinBound checks the numbers the quickstart prints: the
// hybrid fleet stays within the bucket's bound and makes far fewer calls.
func TestFleetHybridWithinBound(t *testing.T) {
	opts, stop, err := redisOptions("")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	limit := int64(500)
	r, err := fleet(opts, "hybrid", tierlimit.PerSecond(limit), 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	bound := limit + int64(float64(limit)*r.elapsed.Seconds())
	if r.admitted > bound {
		t.Errorf("hybrid admitted %d > bound %d", r.admitted, bound)
	}
	if r.decisions < 1000 || r.calls*20 > r.decisions {
		t.Errorf("%d Redis calls for %d decisions, want at most 1 in 20", r.calls, r.decisions)
	}
}
