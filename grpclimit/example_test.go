package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/grpclimit"
	"github.com/tierlimit/tierlimit/local"
)

// Example limits a server to 2 calls per minute per API key and shows
// what a client sees when it is refused.
func Example() {
	lim, err := local.New(tierlimit.PerMinute(2))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	in, err := grpclimit.New(lim, grpclimit.WithName("per-key"), grpclimit.WithKey(grpclimit.KeyMetadata("x-api-key")))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 16)
	go srv.Serve(lis)
	defer srv.Stop()

	cc, err := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k-123")
	for i := 0; i < 3; i++ {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		msg, _, _ := strings.Cut(st.Message(), ",") // the rest is the delay
		fmt.Println(strings.TrimSpace(st.Code().String() + " " + msg))
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("retry after >", ri.GetRetryDelay().AsDuration() > 0, "pushback set:", trailer.Get(grpclimit.PushbackTrailer) != nil)
			}
		}
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted grpclimit: rate limited by "per-key"
	// retry after > true pushback set: true
}
