package grpclimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tierlimit/tierlimit"
)

// An *Interceptor is a go-grpc-middleware v2 ratelimit.Limiter.
var _ ratelimit.Limiter = (*Interceptor)(nil)

// retryInfo returns the RetryInfo delay of err's status, and whether it
// has one.
func retryInfo(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// TestDenial checks a denied call as a grpc-go client sees it: the code,
// RetryInfo equal to the limiter's RetryAfter, the pushback trailer, and
// a message that names the limiter but not the key.
func TestDenial(t *testing.T) {
	const key = "customer-7f3a"
	var mu sync.Mutex
	var last tierlimit.Result
	lim := newLocal(t, tierlimit.PerMinute(1))
	in := mustNew(t, lim, WithName("per-customer"), WithKey(KeyMetadata("x-api-key")),
		WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
			mu.Lock()
			last = res
			mu.Unlock()
		}))
	cc := serve(t, interceptors(in))
	ctx := metadata.AppendToOutgoingContext(testCtx(t), "x-api-key", key)
	if err := unary(ctx, cc); err != nil {
		t.Fatalf("first call: %v, want admitted", err)
	}
	var trailer metadata.MD
	err := unary(ctx, cc, grpc.Trailer(&trailer))
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("second call: code %v (%v), want ResourceExhausted", got, err)
	}
	mu.Lock()
	want := last
	mu.Unlock()
	if want.Allowed || want.RetryAfter <= 0 {
		t.Fatalf("the limiter's last Result = %+v, want a denial with RetryAfter", want)
	}
	got, ok := retryInfo(err)
	if !ok {
		t.Fatalf("status details %v hold no RetryInfo", status.Convert(err).Details())
	}
	if diff := got - want.RetryAfter; diff < -time.Millisecond || diff > time.Millisecond {
		t.Errorf("RetryInfo delay = %v, want RetryAfter %v ±1ms", got, want.RetryAfter)
	}
	wantMS := strconv.FormatInt(int64((want.RetryAfter+time.Millisecond-1)/time.Millisecond), 10)
	if got := trailer.Get(PushbackTrailer); len(got) != 1 || got[0] != wantMS {
		t.Errorf("trailer %s = %q, want [%q]", PushbackTrailer, got, wantMS)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, `"per-customer"`) || strings.Contains(msg, key) {
		t.Errorf("message %q: want the limiter's name and not the key", msg)
	}
}

// TestNeverAdmitted checks that a cost above the burst is refused with a
// pushback that forbids retries and no RetryInfo.
func TestNeverAdmitted(t *testing.T) {
	in := mustNew(t, newLocal(t, tierlimit.PerMinute(2)),
		WithCost(func(context.Context, string) int64 { return 3 }), WithErrorFunc(func(context.Context, string, error) {}))
	cc := serve(t, interceptors(in))
	var trailer metadata.MD
	err := unary(testCtx(t), cc, grpc.Trailer(&trailer))
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("code %v, want ResourceExhausted", got)
	}
	if d, ok := retryInfo(err); ok {
		t.Errorf("RetryInfo %v, want none", d)
	}
	if got := trailer.Get(PushbackTrailer); len(got) != 1 || got[0] != "-1" {
		t.Errorf("trailer %s = %q, want [\"-1\"]", PushbackTrailer, got)
	}
}

// retryConfig is a service config whose retry policy retries
// RESOURCE_EXHAUSTED, with backoffs far longer than the test's limit so
// that only the server's pushback can explain a prompt retry.
const retryConfig = `{"methodConfig": [{
	"name": [{"service": "tierlimit.test.Echo"}],
	"retryPolicy": {
		"maxAttempts": 3,
		"initialBackoff": "10s",
		"maxBackoff": "10s",
		"backoffMultiplier": 1,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]
	}
}]}`

// TestRetryPolicy checks that a grpc-go client with a retry policy for
// RESOURCE_EXHAUSTED is admitted after waiting the pushback, and makes no
// retry before it.
func TestRetryPolicy(t *testing.T) {
	limit := tierlimit.Limit{Rate: 1, Period: 300 * time.Millisecond}
	var mu sync.Mutex
	var attempts []time.Time
	var pushbacks []time.Duration // of the denials, as the trailer rounds them
	in := mustNew(t, newLocal(t, limit), WithKey(KeyMethod), WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
		if !res.Allowed {
			mu.Lock()
			pushbacks = append(pushbacks, (res.RetryAfter+time.Millisecond-1)/time.Millisecond*time.Millisecond)
			mu.Unlock()
		}
	}))
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return h(ctx, req)
	}
	cc := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(record, in.Unary())},
		grpc.WithDefaultServiceConfig(retryConfig))
	ctx := testCtx(t)
	if err := unary(ctx, cc); err != nil {
		t.Fatalf("first call: %v", err)
	}
	start := time.Now()
	if err := unary(ctx, cc); err != nil {
		t.Fatalf("second call: %v, want admitted after a retry", err)
	}
	elapsed := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 || len(pushbacks) != 1 {
		t.Fatalf("server saw %d attempts, %d denied; want 3 attempts, 1 denied", len(attempts), len(pushbacks))
	}
	// The client hears the pushback after the denied attempt reached the
	// server, and waits it out: no retry comes sooner, and none waits for
	// the policy's 10 s backoff.
	gap := attempts[2].Sub(attempts[1])
	if gap < pushbacks[0] || elapsed > 5*time.Second {
		t.Errorf("retry %v after the denied attempt (call took %v), want no sooner than the pushback %v and before the 10s backoff",
			gap, elapsed, pushbacks[0])
	}
}

// TestStreamChargedOnce checks that a stream is charged when it opens and
// not for its messages, and that WithMessageLimiter charges each message.
func TestStreamChargedOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perMsg    int64 // burst of a message limiter; 0: none
		sends     int
		wantCode  codes.Code
		wantMsgNs int // message limiter calls
	}{
		{"no message limit", 0, 5, codes.OK, 0},
		{"message limit not reached", 5, 5, codes.OK, 5},
		{"message limit reached", 3, 5, codes.ResourceExhausted, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := &recorder{lim: newLocal(t, tierlimit.PerMinute(10))}
			msgs := &recorder{lim: newLocal(t, tierlimit.PerMinute(tc.perMsg+1).WithBurst(tc.perMsg+1))}
			opts := []Option{WithKey(KeyMethod)}
			if tc.perMsg > 0 {
				msgs.lim = newLocal(t, tierlimit.PerMinute(tc.perMsg))
				opts = append(opts, WithMessageLimiter("messages", msgs, KeyMethod))
			}
			cc := serve(t, interceptors(mustNew(t, calls, opts...)))
			s, err := cc.NewStream(testCtx(t), &streamDesc, methodStream)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.sends; i++ {
				if err := s.SendMsg(new(emptypb.Empty)); err != nil {
					break // the server ended the stream; RecvMsg tells why
				}
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			err = s.RecvMsg(new(emptypb.Empty))
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("stream ended with %v (%v), want %v", got, err, tc.wantCode)
			}
			if got := calls.seen(); len(got) != 1 || got[0] != (call{methodStream, 1}) {
				t.Errorf("call limiter saw %v, want one charge of 1 at open", got)
			}
			if got := len(msgs.seen()); got != tc.wantMsgNs {
				t.Errorf("message limiter asked %d times, want %d", got, tc.wantMsgNs)
			}
		})
	}
}

// TestKeys checks each key source, over loopback TCP so that calls have
// an IP peer: spoofed forwarded entries from untrusted peers are ignored.
func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		md   []string
		want string
	}{
		{"peer", nil, nil, "127.0.0.1"},
		{"peer ignores XFF from an untrusted peer", nil, []string{"x-forwarded-for", "203.0.113.5"}, "127.0.0.1"},
		{"peer ignores XFF when another proxy is trusted", []Option{WithTrustedProxies("10.0.0.0/8")},
			[]string{"x-forwarded-for", "203.0.113.5"}, "127.0.0.1"},
		{"XFF from a trusted peer", []Option{WithTrustedProxies("127.0.0.1")},
			[]string{"x-forwarded-for", "203.0.113.5"}, "203.0.113.5"},
		{"XFF: spoofed left-most entry ignored", []Option{WithTrustedProxies("127.0.0.0/8", "10.0.0.0/8")},
			[]string{"x-forwarded-for", "198.51.100.1, 203.0.113.5, 10.0.0.2"}, "203.0.113.5"},
		{"Forwarded from a trusted peer", []Option{WithTrustedProxies("127.0.0.1"), WithProxyHeader("Forwarded")},
			[]string{"forwarded", `for="[2001:db8:1:2:3:4:5:6]:443"`}, "2001:db8:1:2::"},
		{"metadata value", []Option{WithKey(KeyMetadata("X-Tenant"))}, []string{"x-tenant", "acme"}, "acme"},
		{"method", []Option{WithKey(KeyMethod)}, nil, methodUnary},
		{"func of ctx and method", []Option{WithKey(func(_ context.Context, m string) (string, bool) {
			return "fn:" + m[strings.LastIndexByte(m, '/')+1:], true
		})}, nil, "fn:Unary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{lim: newLocal(t, tierlimit.PerMinute(10))}
			cc := serveTCP(t, interceptors(mustNew(t, rec, tc.opts...)))
			ctx := metadata.AppendToOutgoingContext(testCtx(t), tc.md...)
			if err := unary(ctx, cc); err != nil {
				t.Fatal(err)
			}
			if got := rec.seen(); len(got) != 1 || got[0].key != tc.want {
				t.Errorf("limiter saw %v, want key %q", got, tc.want)
			}
		})
	}
	t.Run("metadata absent exempts", func(t *testing.T) {
		rec := &recorder{lim: newLocal(t, tierlimit.PerMinute(10))}
		cc := serve(t, interceptors(mustNew(t, rec, WithKey(KeyMetadata("x-tenant")))))
		if err := unary(testCtx(t), cc); err != nil {
			t.Fatal(err)
		}
		if got := rec.seen(); len(got) != 0 {
			t.Errorf("limiter saw %v, want nothing", got)
		}
	})
}

// TestSeveralLimiters checks that a call one limiter refuses charges none
// of the others, whichever is asked first.
func TestSeveralLimiters(t *testing.T) {
	for _, refuserFirst := range []bool{false, true} {
		t.Run("refuser first "+strconv.FormatBool(refuserFirst), func(t *testing.T) {
			ctx := testCtx(t)
			roomy := newLocal(t, tierlimit.PerMinute(5))
			tight := newLocal(t, tierlimit.PerMinute(1))
			if _, err := tight.AllowN(ctx, methodUnary, 1); err != nil { // drained
				t.Fatal(err)
			}
			first, second := tierlimit.Limiter(roomy), tierlimit.Limiter(tight)
			if refuserFirst {
				first, second = second, first
			}
			cc := serve(t, interceptors(mustNew(t, first, WithKey(KeyMethod), WithLimiter("second", second, KeyMethod))))
			for i := 0; i < 3; i++ {
				if err := unary(ctx, cc); status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("call %d: %v, want ResourceExhausted", i, err)
				}
			}
			res, err := roomy.AllowN(ctx, methodUnary, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Remaining != 5 {
				t.Errorf("the admitting limiter holds %d after 3 refused calls, want 5", res.Remaining)
			}
		})
	}
}

// TestShadow checks that shadow mode charges as enforcing would and
// refuses nothing.
func TestShadow(t *testing.T) {
	ctx := testCtx(t)
	lim := newLocal(t, tierlimit.PerMinute(2))
	var denials int
	var mu sync.Mutex
	in := mustNew(t, lim, WithKey(KeyMethod), WithShadow(), WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
		mu.Lock()
		defer mu.Unlock()
		if !res.Allowed {
			denials++
		}
	}))
	cc := serve(t, interceptors(in))
	for i := 0; i < 4; i++ {
		if err := unary(ctx, cc); err != nil {
			t.Fatalf("call %d: %v, want served in shadow mode", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if denials != 2 {
		t.Errorf("%d denials decided, want 2", denials)
	}
	if res, _ := lim.AllowN(ctx, methodUnary, 0); res.Remaining != 0 {
		t.Errorf("limiter holds %d, want 0: shadow mode charges", res.Remaining)
	}
}

// TestLimitAdapter checks the go-grpc-middleware v2 ratelimit adapter.
func TestLimitAdapter(t *testing.T) {
	in := mustNew(t, newLocal(t, tierlimit.PerMinute(1)), WithName("api"), WithKey(KeyMethod))
	cc := serve(t, []grpc.ServerOption{grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(in))})
	ctx := testCtx(t)
	if err := unary(ctx, cc); err != nil {
		t.Fatalf("first call: %v", err)
	}
	err := unary(ctx, cc)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), `"api"`) {
		t.Errorf("second call: %v, want ResourceExhausted naming \"api\"", err)
	}
}

// TestWaitUnary checks that the client interceptor paces calls to the
// limit instead of sending them to be refused.
func TestWaitUnary(t *testing.T) {
	limit := tierlimit.Limit{Rate: 1, Period: 100 * time.Millisecond}
	server := mustNew(t, newLocal(t, limit.WithBurst(2)), WithKey(KeyMethod))
	cc := serve(t, interceptors(server), grpc.WithUnaryInterceptor(WaitUnary(newLocal(t, limit), nil)))
	ctx := testCtx(t)
	start := time.Now()
	for i := 0; i < 4; i++ {
		if err := unary(ctx, cc); err != nil {
			t.Fatalf("call %d: %v, want admitted", i, err)
		}
	}
	if got := time.Since(start); got < 290*time.Millisecond {
		t.Errorf("4 calls at 1 per 100ms took %v, want at least 300ms", got)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := unary(short, cc); !errors.Is(err, tierlimit.ErrWaitDeadline) {
		t.Errorf("call with a deadline before its turn: %v, want ErrWaitDeadline", err)
	}
}

// TestNewErrors checks that New rejects bad options with ErrInvalidOption.
func TestNewErrors(t *testing.T) {
	lim := newLocal(t, tierlimit.PerMinute(1))
	for _, tc := range []struct {
		name string
		lim  tierlimit.Limiter
		opts []Option
	}{
		{"nil limiter", nil, nil},
		{"nil option", lim, []Option{nil}},
		{"empty name", lim, []Option{WithName("")}},
		{"long name", lim, []Option{WithName(strings.Repeat("n", 65))}},
		{"control character", lim, []Option{WithName("a\nb")}},
		{"nil key", lim, []Option{WithKey(nil)}},
		{"nil extra limiter", lim, []Option{WithLimiter("x", nil, nil)}},
		{"nil message limiter", lim, []Option{WithMessageLimiter("x", nil, nil)}},
		{"two names", lim, []Option{WithLimiter("default", lim, nil)}},
		{"message limiter named as a call limiter", lim, []Option{WithMessageLimiter("default", lim, nil)}},
		{"bad proxy", lim, []Option{WithTrustedProxies("10.0.0.0/33")}},
		{"bad proxy header", lim, []Option{WithProxyHeader("x-real-ip")}},
		{"bad prefix", lim, []Option{WithIPv6Prefix(0)}},
		{"nil cost", lim, []Option{WithCost(nil)}},
		{"nil error func", lim, []Option{WithErrorFunc(nil)}},
		{"nil decision func", lim, []Option{WithDecisionFunc(nil)}},
		{"nil logger", lim, []Option{WithLogger(nil)}},
	} {
		if _, err := New(tc.lim, tc.opts...); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", tc.name, err)
		}
	}
}
