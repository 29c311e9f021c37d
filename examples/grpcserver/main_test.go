package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestRun sends twice the burst through the retrying client: every call
// succeeds, some only after refused attempts, and the whole takes about
// as long as the limit says.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := run(ctx, config{rate: 5, calls: 10}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	elapsed := time.Since(start)
	if n := strings.Count(out.String(), ": ok in "); n != 10 {
		t.Errorf("%d calls succeeded, want 10:\n%s", n, out.String())
	}
	if strings.Contains(out.String(), "refused 0 attempts") {
		t.Errorf("no attempt refused, want some past the burst of 5:\n%s", out.String())
	}
	// 5 calls from the burst, 5 more at 5/s: at least about a second.
	if elapsed < 800*time.Millisecond {
		t.Errorf("10 calls at 5/s took %v, want about 1s or more", elapsed)
	}
}
