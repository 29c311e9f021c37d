package grpclimit

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// answer is what a limiter or concurrency limiter answered a call.
type answer struct {
	key     string
	allowed bool
	err     error
}

// answers records what the limiters of one call answered.
type answers struct {
	mu   sync.Mutex
	rate []answer
	conc []answer
}

func (a *answers) add(to *[]answer, x answer) {
	a.mu.Lock()
	*to = append(*to, x)
	a.mu.Unlock()
}

// recordingLimiter passes AllowN to lim and records its answers in
// *rec, the call's.
type recordingLimiter struct {
	lim tierlimit.Limiter
	rec *atomic.Pointer[answers]
}

func (l recordingLimiter) AllowN(ctx context.Context, key string, n int64) (tierlimit.Result, error) {
	res, err := l.lim.AllowN(ctx, key, n)
	a := l.rec.Load()
	a.add(&a.rate, answer{key, err == nil && res.Allowed, err})
	return res, err
}

// recordingConc passes TryAcquire to c and records its answers.
type recordingConc struct {
	c   tierlimit.Concurrency
	rec *atomic.Pointer[answers]
}

func (r recordingConc) Acquire(ctx context.Context, key string) (tierlimit.Permit, error) {
	return r.c.Acquire(ctx, key)
}

func (r recordingConc) TryAcquire(ctx context.Context, key string) (tierlimit.Permit, bool, error) {
	p, ok, err := r.c.TryAcquire(ctx, key)
	a := r.rec.Load()
	a.add(&a.conc, answer{key, ok && err == nil, err})
	return p, ok, err
}

// trailerStream is the server side of a call, as grpc.SetTrailer needs it,
// keeping the trailer.
type trailerStream struct{ trailer metadata.MD }

func (s *trailerStream) Method() string               { return methodUnary }
func (s *trailerStream) SetHeader(metadata.MD) error  { return nil }
func (s *trailerStream) SendHeader(metadata.MD) error { return nil }
func (s *trailerStream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// FuzzDoors runs one call through an Interceptor of a real local limiter
// and concurrency limiter whose LimitFunc, PermitFunc and KeyFunc answer
// what the fuzzer says (invalid limits, Blocked, empty and huge keys, any
// permits), from a peer with forwarded metadata, at a cost, with shadow
// mode on or off. No input panics, and none gets an unlimited call: a
// call served outside shadow mode was exempted by its KeyFunc, or
// admitted by the limiter and given a permit, both asked with a non-empty
// key. A KeyFunc's empty key is Internal; a refusal's pushback is never
// 0, and is the RetryInfo's delay when there is one, -1 when there is
// none (but for a concurrency refusal, which sets none).
func FuzzDoors(f *testing.F) {
	f.Add("tenant", true, "192.0.2.1", "198.51.100.1, 10.0.0.9", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("", true, "10.0.0.1", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("", false, "192.0.2.1", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("suspended", true, "192.0.2.1", "", int64(0), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("blocked", true, "192.0.2.1", "", int64(0), int64(0), int64(-1), int64(0), int64(1), false)
	f.Add("blocked", true, "192.0.2.1", "", int64(0), int64(0), int64(-1), int64(0), int64(1), true)
	f.Add("suspended", true, "192.0.2.1", "", int64(-3), int64(0), int64(-2), int64(0), int64(1), true)
	f.Add("permits", true, "192.0.2.1", "", int64(10), int64(1_000_000), int64(0), int64(-1), int64(1), false)
	f.Add("permits", true, "192.0.2.1", "", int64(10), int64(1_000_000), int64(0), int64(tierlimit.MaxPermits+1), int64(1), false)
	f.Add("costly", true, "192.0.2.1", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(11), false)
	f.Add("drained", true, "192.0.2.1", "", int64(1), int64(3_600_000_000), int64(0), int64(0), int64(1), false)
	f.Add(strings.Repeat("k", tierlimit.MaxKeyLen+1), true, "2001:db8::1", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("t", true, "10.0.0.1", strings.Repeat("10.0.0.2, ", 20), int64(1<<50), int64(1), int64(1<<55), int64(1), int64(-1), false)

	var (
		rec    atomic.Pointer[answers]
		limit  atomic.Pointer[tierlimit.Limit]
		perKey atomic.Int64
	)
	lim, err := local.New(tierlimit.PerSecond(5), local.WithLimitFunc(func(string) tierlimit.Limit { return *limit.Load() }))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { lim.Close() })
	conc, err := local.NewConcurrency(1, local.WithPermitFunc(func(string) int64 { return perKey.Load() }))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conc.Close() })

	f.Fuzz(func(t *testing.T, key string, ok bool, peerIP, xff string, rate, periodMicros, burst, permits, cost int64, shadow bool) {
		l := tierlimit.Limit{Rate: rate, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
		limit.Store(&l)
		perKey.Store(permits)
		a := &answers{}
		rec.Store(a)
		opts := []Option{
			WithKey(func(context.Context, string) (string, bool) { return key, ok }),
			WithConcurrency(recordingConc{conc, &rec}),
			WithCost(func(context.Context, string) int64 { return cost }),
			WithTrustedProxies("10.0.0.0/8"),
			WithErrorFunc(func(context.Context, string, error) {}),
		}
		if shadow {
			opts = append(opts, WithShadow())
		}
		in, err := New(recordingLimiter{lim, &rec}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ts := &trailerStream{}
		ctx := grpc.NewContextWithServerTransportStream(context.Background(), ts)
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(peerIP), Port: 1}})
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", xff))
		served := false
		_, err = in.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodUnary}, func(context.Context, any) (any, error) {
			served = true
			return nil, nil
		})

		code := status.Code(err)
		switch code {
		case codes.OK, codes.ResourceExhausted, codes.Internal:
		default:
			t.Fatalf("code %v (%v)", code, err)
		}
		if served != (code == codes.OK) {
			t.Fatalf("code %v, served %v", code, served)
		}
		if ok && key == "" && !shadow && code != codes.Internal {
			t.Errorf("KeyFunc's empty key: code %v, want Internal", code)
		}
		if served && !shadow && ok {
			checkAdmitted(t, "limiter", a.rate)
			checkAdmitted(t, "concurrency limiter", a.conc)
		}
		pushback := ts.trailer.Get(PushbackTrailer)
		if len(pushback) > 1 {
			t.Fatalf("trailer %s = %q, want one value at most", PushbackTrailer, pushback)
		}
		d, hasInfo := retryInfo(err)
		switch {
		case code == codes.OK:
			if len(pushback) != 0 || hasInfo {
				t.Errorf("served with pushback %q, RetryInfo %v", pushback, d)
			}
		case hasInfo:
			want := strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
			if d <= 0 || len(pushback) != 1 || pushback[0] != want {
				t.Errorf("RetryInfo %v with pushback %q, want a delay above 0 and pushback [%q]", d, pushback, want)
			}
		case len(pushback) == 0:
			if !strings.Contains(status.Convert(err).Message(), "in flight") {
				t.Errorf("refusal %v without RetryInfo or pushback, want a pushback of -1", err)
			}
		case pushback[0] != noRetry:
			t.Errorf("refusal %v without RetryInfo with pushback %q, want [%q]", err, pushback, noRetry)
		}
	})
}

// checkAdmitted checks that a served call was asked of a limiter, with a
// non-empty key no longer than tierlimit.MaxKeyLen, and admitted.
func checkAdmitted(t *testing.T, what string, as []answer) {
	t.Helper()
	if len(as) != 1 {
		t.Fatalf("served after %d answers of the %s, want 1", len(as), what)
	}
	switch x := as[0]; {
	case x.key == "" || len(x.key) > tierlimit.MaxKeyLen:
		t.Errorf("served with the %s asked for key %q", what, x.key)
	case x.err != nil && (errors.Is(x.err, tierlimit.ErrInvalidLimit) || errors.Is(x.err, tierlimit.ErrInvalidCost) || errors.Is(x.err, tierlimit.ErrInvalidKey)):
		t.Errorf("served though the %s answered %v", what, x.err)
	case x.err == nil && !x.allowed:
		t.Errorf("served though the %s refused", what)
	}
}
