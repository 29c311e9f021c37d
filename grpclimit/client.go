package grpclimit

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/tierlimit/tierlimit"
)

// Waiter is a limiter that waits its turn: local.Limiter, the remote
// limiters and hybrid.Limiter are Waiters.
type Waiter interface {
	WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
}

// WaitUnary returns a unary client interceptor that waits until w admits
// a call, at cost 1, before sending it: a batch client then keeps to the
// server's limit instead of being refused. key keys calls (nil: by full
// method; ok false sends the call at once). A wait that cannot end before
// the call's deadline fails the call at once with an error wrapping
// tierlimit.ErrWaitDeadline, without sending it.
func WaitUnary(w Waiter, key KeyFunc) grpc.UnaryClientInterceptor {
	if key == nil {
		key = KeyMethod
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := wait(ctx, w, key, method); err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// WaitStream returns a stream client interceptor that waits, as WaitUnary
// does, before it opens a stream.
func WaitStream(w Waiter, key KeyFunc) grpc.StreamClientInterceptor {
	if key == nil {
		key = KeyMethod
	}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := wait(ctx, w, key, method); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

func wait(ctx context.Context, w Waiter, key KeyFunc, method string) error {
	k, ok := key(ctx, method)
	if !ok || k == "" {
		return nil
	}
	if _, err := w.WaitN(ctx, k, 1); err != nil {
		return fmt.Errorf("grpclimit: wait for %s: %w", method, err)
	}
	return nil
}
