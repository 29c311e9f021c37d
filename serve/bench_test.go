package serve

import (
	"context"
	"fmt"
	"testing"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkShouldRateLimit measures the server's own path, without gRPC:
// a request of one descriptor matched and decided on a hot hybrid key (from
// its lease), on a miniredis.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("descriptors=%d", n), func(b *testing.B) {
			cfg, err := ParseConfig(File{Name: "bench.yaml", Data: []byte(
				"domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}")})
			if err != nil {
				b.Fatal(err)
			}
			s, err := New(cfg, mini(b), patient)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			req := &rls.RateLimitRequest{Domain: "d"}
			for i := range n {
				req.Descriptors = append(req.Descriptors, desc("remote_address", fmt.Sprintf("10.0.0.%d", i)))
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := s.ShouldRateLimit(ctx, req)
					if err != nil || resp.OverallCode != rls.RateLimitResponse_OK {
						b.Errorf("ShouldRateLimit = %v, %v", resp, err)
						return
					}
				}
			})
		})
	}
}
