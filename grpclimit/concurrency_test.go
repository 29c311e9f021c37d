package grpclimit

import (
	"context"
	"errors"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// failingConc is a concurrency limiter whose every call fails.
type failingConc struct{}

func (failingConc) Acquire(context.Context, string) (tierlimit.Permit, error) {
	return tierlimit.Permit{}, errors.New("backend down")
}
func (failingConc) TryAcquire(context.Context, string) (tierlimit.Permit, bool, error) {
	return tierlimit.Permit{}, false, errors.New("backend down")
}

type keyCtx struct{}

// keyOf keys a call by the value the test put in its context.
func keyOf(ctx context.Context, _ string) (string, bool) {
	k, _ := ctx.Value(keyCtx{}).(string)
	return k, k != ""
}

func TestWithConcurrency(t *testing.T) {
	lim, err := local.New(tierlimit.PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	conc, _ := local.NewConcurrency(1, local.WithPermitFunc(func(k string) int64 {
		if k == "bad" {
			return -2
		}
		return tierlimit.DefaultPermits
	}))
	in, err := New(lim, WithKey(keyOf), WithConcurrency(conc))
	if err != nil {
		t.Fatal(err)
	}
	unary := in.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: "/s/m"}
	call := func(key string, h grpc.UnaryHandler) codes.Code {
		ctx := context.WithValue(context.Background(), keyCtx{}, key)
		_, err := unary(ctx, nil, info, h)
		return status.Code(err)
	}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	var inner []codes.Code
	got := call("a", func(ctx context.Context, req any) (any, error) {
		// a's one permit is held while its handler runs.
		inner = append(inner, call("a", ok), call("b", ok), call("", ok), call("bad", ok))
		return nil, nil
	})
	want := []codes.Code{codes.ResourceExhausted, codes.OK, codes.OK, codes.ResourceExhausted}
	if got != codes.OK || len(inner) != len(want) {
		t.Fatalf("outer call = %v with inner %v, want OK", got, inner)
	}
	for i := range want {
		if inner[i] != want[i] {
			t.Errorf("inner call %d = %v, want %v", i, inner[i], want[i])
		}
	}
	if got := call("a", ok); got != codes.OK {
		t.Errorf("call of a after its call returned = %v, want OK: the permit was not released", got)
	}
	for _, tt := range []struct {
		name string
		opts []Option
		want codes.Code
	}{
		{"fail open", nil, codes.OK},
		{"fail closed", []Option{WithFailClosed()}, codes.Unavailable},
	} {
		var reported error
		opts := append([]Option{WithKey(keyOf), WithConcurrency(failingConc{}),
			WithErrorFunc(func(_ context.Context, _ string, err error) { reported = err })}, tt.opts...)
		in, err := New(lim, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.WithValue(context.Background(), keyCtx{}, "z")
		_, err = in.Unary()(ctx, nil, info, ok)
		if status.Code(err) != tt.want || reported == nil {
			t.Errorf("%s: a failing concurrency limiter gives %v (reported %v), want %v and a report", tt.name, status.Code(err), reported, tt.want)
		}
	}
	if _, err := New(lim, WithConcurrency(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("New(WithConcurrency(nil)) = %v, want ErrInvalidOption", err)
	}
}

// ctxStream is a server stream that has only a context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// TestWithConcurrencyStream: a stream holds its permit until its handler
// returns.
func TestWithConcurrencyStream(t *testing.T) {
	lim, _ := local.New(tierlimit.PerSecond(1000))
	conc, _ := local.NewConcurrency(1)
	in, err := New(lim, WithKey(keyOf), WithConcurrency(conc))
	if err != nil {
		t.Fatal(err)
	}
	stream := in.Stream()
	info := &grpc.StreamServerInfo{FullMethod: "/s/m"}
	ss := ctxStream{ctx: context.WithValue(context.Background(), keyCtx{}, "a")}
	var inner codes.Code
	err = stream(nil, ss, info, func(any, grpc.ServerStream) error {
		inner = status.Code(stream(nil, ss, info, func(any, grpc.ServerStream) error { return nil }))
		return nil
	})
	if err != nil || inner != codes.ResourceExhausted {
		t.Errorf("stream = %v with a second stream of its key inside = %v; want nil, ResourceExhausted", err, inner)
	}
	if err := stream(nil, ss, info, func(any, grpc.ServerStream) error { return nil }); err != nil {
		t.Errorf("stream after the first ended = %v, want nil: the permit was not released", err)
	}
}
