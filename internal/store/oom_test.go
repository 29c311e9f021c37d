package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestOOMUnderEvictingPolicyIsPressure: a Redis at maxmemory answers a
// script that writes with OOM. Under a policy that evicts keys that is
// memory pressure, which passes as Redis evicts: not a misconfiguration
// (the hybrid limiter falls back, counted, instead of failing its
// callers). Under noeviction it is one, as tierlimit.Misconfigured says.
func TestOOMUnderEvictingPolicyIsPressure(t *testing.T) {
	for _, c := range []struct {
		policy        string
		misconfigured bool
	}{
		{"allkeys-lru", false},
		{"volatile-ttl", false},
		{"noeviction", true},
	} {
		t.Run(c.policy, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := s.Client(t)
			ctx := context.Background()
			// Below what an empty server uses: every write is refused.
			for _, kv := range [][2]string{{"maxmemory-policy", c.policy}, {"maxmemory", "1"}} {
				if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			tb, err := New(rdb, TokenBucket, tierlimit.PerSecond(10), Config{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = tb.AllowAll(ctx, tierlimit.Take{Key: "k", N: 1})
			if err == nil {
				t.Fatal("a write to a server over its maxmemory succeeded, want OOM")
			}
			if !strings.Contains(err.Error(), "OOM ") {
				t.Fatalf("a write to a server over its maxmemory = %v, want an OOM reply", err)
			}
			if got := tb.Misconfigured(err); got != c.misconfigured {
				t.Errorf("Misconfigured(%v) under %s = %v, want %v", err, c.policy, got, c.misconfigured)
			}
			if got := errors.Is(err, tierlimit.ErrMisconfigured); got != c.misconfigured {
				t.Errorf("errors.Is(%v, ErrMisconfigured) under %s = %v, want %v", err, c.policy, got, c.misconfigured)
			}
		})
	}
}
