package grpclimit

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/remote"
)

// TestStoppedRedis checks both error policies against a remote limiter
// whose Redis was stopped: failing open serves the call and reports the
// error; failing closed refuses it with Unavailable.
func TestStoppedRedis(t *testing.T) {
	if !redistest.Available() {
		if redistest.Required() {
			t.Fatal("redis-server is required (TIERLIMIT_REQUIRE_REDIS) and missing")
		}
		t.Skip("no redis-server")
	}
	s := redistest.Start(t)
	lim, err := remote.NewTokenBucket(s.Client(t), tierlimit.PerMinute(100))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := lim.AllowN(ctx, "warm", 1); err != nil {
		t.Fatalf("AllowN before the stop: %v", err)
	}
	s.Kill()
	for _, tc := range []struct {
		name string
		opts []Option
		want codes.Code
	}{
		{"fail open (default)", nil, codes.OK},
		{"fail closed", []Option{WithFailClosed()}, codes.Unavailable},
		{"fail closed in shadow mode", []Option{WithFailClosed(), WithShadow()}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var errs []error
			opts := append([]Option{WithKey(KeyMethod), WithErrorFunc(func(_ context.Context, _ string, err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			})}, tc.opts...)
			cc := serve(t, interceptors(mustNew(t, lim, opts...)))
			if err := unary(ctx, cc); status.Code(err) != tc.want {
				t.Fatalf("call: %v, want %v", err, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(errs) != 1 || errors.Is(errs[0], tierlimit.ErrInvalidCost) {
				t.Errorf("error func got %v, want one backend error", errs)
			}
		})
	}
}
