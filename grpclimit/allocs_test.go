package grpclimit

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tierlimit/tierlimit"
)

// TestInterceptorAllocs checks what the unary interceptor allocates per
// admitted call beyond the limiter: nothing when keyed by method, the
// key's text when keyed by peer, and the copy of the proxy metadata
// behind a trusted proxy (bar: at most 4).
func TestInterceptorAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 50000}})
	info := &grpc.UnaryServerInfo{FullMethod: methodUnary}
	req := new(emptypb.Empty)
	handler := func(context.Context, any) (any, error) { return req, nil }
	lim := newLocal(t, tierlimit.PerSecond(1_000_000_000))
	direct := testing.AllocsPerRun(1000, func() {
		if _, err := lim.AllowN(ctx, methodUnary, 1); err != nil {
			t.Fatal(err)
		}
	})
	proxied := metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", "203.0.113.5"))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []Option
		want float64
	}{
		{"method", ctx, []Option{WithKey(KeyMethod)}, 0},
		{"peer", ctx, nil, 1},
		{"client behind a trusted proxy", proxied, []Option{WithTrustedProxies("192.0.2.0/24")}, 2}, // the metadata's copy, the key
	} {
		u := mustNew(t, lim, tc.opts...).Unary()
		got := testing.AllocsPerRun(1000, func() {
			if _, err := u(tc.ctx, req, info, handler); err != nil {
				t.Fatal(err)
			}
		}) - direct
		if got != tc.want {
			t.Errorf("%s: the interceptor allocates %v times per call beyond the limiter, want %v", tc.name, got, tc.want)
		}
	}
}
