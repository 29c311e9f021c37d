package serve

import (
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ServiceName is the gRPC service a Server implements, as health checks name
// it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Register registers s and a grpc.health.v1 service on g, and returns the
// health server: SERVING for "" and ServiceName. Call its Shutdown before
// g.GracefulStop, so that health checks turn away new traffic while the
// requests in flight finish.
func (s *Server) Register(g *grpc.Server) *health.Server {
	rls.RegisterRateLimitServiceServer(g, s)
	h := health.NewServer()
	healthpb.RegisterHealthServer(g, h)
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	return h
}
