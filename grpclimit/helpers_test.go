package grpclimit

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// The methods of the test service: a unary call, and a stream that
// receives messages until the client closes and then answers once.
const (
	methodUnary  = "/tierlimit.test.Echo/Unary"
	methodStream = "/tierlimit.test.Echo/Stream"
)

// echoDesc is the test service, written by hand: no generated code.
var echoDesc = grpc.ServiceDesc{
	ServiceName: "tierlimit.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(context.Context, any) (any, error) { return new(emptypb.Empty), nil }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: methodUnary}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ClientStreams: true,
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			for {
				if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
					if errors.Is(err, io.EOF) {
						return ss.SendMsg(new(emptypb.Empty))
					}
					return err
				}
			}
		},
	}},
}

var streamDesc = grpc.StreamDesc{StreamName: "Stream", ClientStreams: true, ServerStreams: true}

// serve starts a server with opts on a bufconn listener and returns a
// client connected to it, with copts; both stop with the test.
func serve(t *testing.T, opts []grpc.ServerOption, copts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return serveT(t, opts, copts...)
}

func serveT(t testing.TB, opts []grpc.ServerOption, copts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	return serveOn(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }, opts, copts...)
}

// serveTCP is serve on a loopback TCP listener, so that calls have an IP
// peer.
func serveTCP(t testing.TB, opts []grpc.ServerOption, copts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	var d net.Dialer
	return serveOn(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }, opts, copts...)
}

func serveOn(t testing.TB, lis net.Listener, dial func(context.Context, string) (net.Conn, error), opts []grpc.ServerOption, copts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&echoDesc, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient("passthrough:///test",
		append([]grpc.DialOption{grpc.WithContextDialer(dial), grpc.WithTransportCredentials(insecure.NewCredentials())}, copts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}

// interceptors installs in on a server.
func interceptors(in *Interceptor) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream())}
}

func unary(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	return cc.Invoke(ctx, methodUnary, new(emptypb.Empty), new(emptypb.Empty), opts...)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newLocal(t testing.TB, limit tierlimit.Limit) *local.Limiter {
	t.Helper()
	l, err := local.New(limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func mustNew(t testing.TB, lim tierlimit.Limiter, opts ...Option) *Interceptor {
	t.Helper()
	in, err := New(lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// call is one AllowN a recorder saw.
type call struct {
	key string
	n   int64
}

// recorder is a limiter that records its calls and asks lim.
type recorder struct {
	lim tierlimit.Limiter

	mu    sync.Mutex
	calls []call
}

func (r *recorder) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	r.mu.Lock()
	r.calls = append(r.calls, call{key, n})
	r.mu.Unlock()
	return r.lim.AllowN(ctx, key, n)
}

func (r *recorder) seen() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

// failing is a limiter whose store is down.
type failing struct{}

var errDown = errors.New("store down")

func (failing) AllowN(context.Context, string, int64) (tierlimit.Result, error) {
	return tierlimit.Result{}, errDown
}
