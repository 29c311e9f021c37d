package grpclimit

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tierlimit/tierlimit"
)

// BenchmarkOverhead measures what the interceptor adds to a unary call
// over a bufconn server and a real grpc-go client, against a handler that
// calls the same limiter directly with the same key: "direct" and the
// interceptor variants run alternately within one run (-count), so
// benchstat compares medians of one machine's same minutes.
//
//	go test -run '^$' -bench Overhead -benchmem -count 10 . | tee /tmp/grpc.txt
//	benchstat -col /via /tmp/grpc.txt
func BenchmarkOverhead(b *testing.B) {
	limit := tierlimit.PerSecond(1_000_000_000)
	for _, v := range []struct {
		name string
		opts []Option // nil: no interceptor, the handler calls the limiter
	}{
		{"via=direct", nil},
		{"via=interceptor-method", []Option{WithKey(KeyMethod)}},
		{"via=interceptor-peer", []Option{}},
	} {
		b.Run(v.name, func(b *testing.B) {
			lim := newLocal(b, limit)
			var opts []grpc.ServerOption
			if v.opts != nil {
				opts = interceptors(mustNew(b, lim, v.opts...))
			}
			cc := serveBench(b, opts, v.opts == nil, lim)
			ctx := context.Background()
			in, out := new(emptypb.Empty), new(emptypb.Empty)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := cc.Invoke(ctx, methodUnary, in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// serveBench is serve whose unary handler, when direct, asks lim itself
// as the interceptor would (key: the full method, cost 1).
func serveBench(b *testing.B, opts []grpc.ServerOption, direct bool, lim tierlimit.Limiter) *grpc.ClientConn {
	if direct {
		opts = append(opts, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			res, err := lim.AllowN(ctx, info.FullMethod, 1)
			if err != nil || !res.Allowed {
				b.Fatalf("direct AllowN = %+v, %v", res, err)
			}
			return h(ctx, req)
		}))
	}
	return serveT(b, opts)
}

// BenchmarkInterceptorFunc measures the same difference without the
// transport's noise: the unary interceptor func called as grpc-go calls
// it, against the limiter called directly, in one run.
//
//	go test -run '^$' -bench InterceptorFunc -benchmem -count 10 . | tee /tmp/icpt.txt
func BenchmarkInterceptorFunc(b *testing.B) {
	limit := tierlimit.PerSecond(1_000_000_000)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 50000}})
	info := &grpc.UnaryServerInfo{FullMethod: methodUnary}
	req := new(emptypb.Empty)
	handler := func(context.Context, any) (any, error) { return req, nil }
	for _, v := range []struct {
		name string
		opts []Option // nil: the limiter called directly
	}{
		{"via=direct", nil},
		{"via=interceptor-method", []Option{WithKey(KeyMethod)}},
		{"via=interceptor-peer", []Option{}},
	} {
		b.Run(v.name, func(b *testing.B) {
			lim := newLocal(b, limit)
			call := func() error {
				res, err := lim.AllowN(ctx, methodUnary, 1)
				if err != nil || !res.Allowed {
					b.Fatalf("AllowN = %+v, %v", res, err)
				}
				_, err = handler(ctx, req)
				return err
			}
			if v.opts != nil {
				u := mustNew(b, lim, v.opts...).Unary()
				call = func() error {
					_, err := u(ctx, req, info, handler)
					return err
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
