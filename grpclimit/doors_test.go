package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// The tests of this file are the doors of the design's section 7: what a
// user function gets wrong, and a key that may never pass, are denials
// no retry hint of 0 follows, on every tier and under every error policy.

// suspended is the tenant the test LimitFuncs and PermitFuncs answer
// wrongly for; every other tenant has the default.
const suspended = "tenant-suspended"

// invalidLimits are LimitFunc answers that are neither a valid Limit nor
// tierlimit.Blocked.
var invalidLimits = []struct {
	name  string
	limit tierlimit.Limit
}{
	{"PerSecond(0)", tierlimit.PerSecond(0)},
	{"negative rate", tierlimit.PerSecond(-5)},
	{"no period", tierlimit.Limit{Rate: 10}},
	{"negative burst", tierlimit.PerSecond(10).WithBurst(-2)},
	{"rate above MaxRate", tierlimit.PerSecond(tierlimit.MaxRate + 1)},
}

// errorPolicies are the ways the interceptor treats a failing limiter.
var errorPolicies = []struct {
	name string
	opts []Option
}{
	{"fail open", nil},
	{"fail closed", []Option{WithFailClosed()}},
}

// slowRedis is the hybrid limiters' call budget: on a loaded machine a
// slow answer of Redis must not become a fallback decision, since these
// tests are about what the doors do with the limiters' answers, not about
// outages.
const slowRedis = 5 * time.Second

// prefixes makes each limiter's Redis prefix its own.
var prefixes atomic.Int64

func prefix() string { return fmt.Sprintf("doors%d:", prefixes.Add(1)) }

// tier builds a limiter of one tier with f as its LimitFunc.
type tier struct {
	name string
	make func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter
}

// rateTiers returns a tier for local, remote (token bucket and GCRA) and
// hybrid, the last three on s: one redis-server per test, a prefix per
// limiter.
func rateTiers(s *redistest.Server) []tier {
	def := tierlimit.PerSecond(100)
	closing := func(t *testing.T, l interface {
		tierlimit.Limiter
		Close() error
	}, err error) tierlimit.Limiter {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	return []tier{
		{"local", func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := local.New(def, local.WithLimitFunc(f))
			return closing(t, l, err)
		}},
		{"remote token bucket", func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := remote.NewTokenBucket(s.Client(t), def, remote.WithLimitFunc(f), remote.WithPrefix(prefix()))
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
		{"remote GCRA", func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := remote.NewGCRA(s.Client(t), def, remote.WithLimitFunc(f), remote.WithPrefix(prefix()))
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
		{"hybrid", func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := hybrid.New(s.Client(t), def, hybrid.WithLimitFunc(f), hybrid.WithPrefix(prefix()),
				hybrid.WithCallBudget(slowRedis))
			return closing(t, l, err)
		}},
	}
}

// errPlansDown is the error of downLookup's failures.
var errPlansDown = errors.New("plan store unreachable")

// downLookup is a LimitLookup that fails for the suspended tenant and
// answers the default for the others.
func downLookup(key string) (tierlimit.Limit, error) {
	if key == suspended {
		return tierlimit.Limit{}, errPlansDown
	}
	return tierlimit.Limit{}, nil
}

// lookupTiers returns a tier for local, every remote algorithm and hybrid
// whose LimitLookup is downLookup (failing closed, the default), on s.
func lookupTiers(s *redistest.Server) []tier {
	def := tierlimit.PerSecond(100)
	type remoteNew func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (tierlimit.Limiter, error)
	remoteTier := func(name string, mk remoteNew) tier {
		return tier{name, func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := mk(s.Client(t), def, remote.WithLimitLookup(downLookup), remote.WithPrefix(prefix()))
			if err != nil {
				t.Fatal(err)
			}
			return l
		}}
	}
	tiers := []tier{
		{"local", func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := local.New(def, local.WithLimitLookup(downLookup))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		}},
		{"hybrid", func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := hybrid.New(s.Client(t), def, hybrid.WithLimitLookup(downLookup), hybrid.WithPrefix(prefix()),
				hybrid.WithCallBudget(slowRedis))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		}},
	}
	for _, r := range []struct {
		name string
		mk   remoteNew
	}{
		{"remote token bucket", adapt(remote.NewTokenBucket)},
		{"remote GCRA", adapt(remote.NewGCRA)},
		{"remote fixed window", adapt(remote.NewFixedWindow)},
		{"remote anchored window", adapt(remote.NewAnchoredWindow)},
		{"remote sliding log", adapt(remote.NewSlidingLog)},
		{"remote sliding window", adapt(remote.NewSlidingWindow)},
	} {
		tiers = append(tiers, remoteTier(r.name, r.mk))
	}
	return tiers
}

// adapt returns a remote constructor as one of a tierlimit.Limiter.
func adapt[L tierlimit.Limiter](mk func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (L, error)) func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (tierlimit.Limiter, error) {
	return func(rdb redis.UniversalClient, l tierlimit.Limit, opts ...remote.Option) (tierlimit.Limiter, error) {
		r, err := mk(rdb, l, opts...)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// planOf returns a LimitFunc that answers limit for the suspended tenant
// and the default for the others.
func planOf(limit tierlimit.Limit) tierlimit.LimitFunc {
	return func(key string) tierlimit.Limit {
		if key == suspended {
			return limit
		}
		return tierlimit.Limit{}
	}
}

// counted is a server whose handlers count the calls and streams they
// serve, behind an Interceptor.
type counted struct {
	cc     *grpc.ClientConn
	served atomic.Int64
}

// refuses checks that calls unary calls and a stream of tenant are
// refused with ResourceExhausted and no retry hint, and that none was
// served.
func (c *counted) refuses(t *testing.T, tenant string, calls int) {
	t.Helper()
	ctx := tenantCtx(t, tenant)
	for i := range calls {
		var trailer metadata.MD
		err := unary(ctx, c.cc, grpc.Trailer(&trailer))
		checkNoRetry(t, fmt.Sprintf("call %d", i), err, trailer, codes.ResourceExhausted)
	}
	trailer, err := stream(ctx, c.cc)
	checkNoRetry(t, "stream", err, trailer, codes.ResourceExhausted)
	if got := c.served.Load(); got != 0 {
		t.Errorf("%d calls of tenant %q served, want 0", got, tenant)
	}
}

// servesAnother checks that a call of another tenant, after refusals
// only, is served.
func (c *counted) servesAnother(t *testing.T) {
	t.Helper()
	if err := unary(tenantCtx(t, "tenant-paying"), c.cc); err != nil || c.served.Load() != 1 {
		t.Errorf("call of another tenant: %v, served %d; want served", err, c.served.Load())
	}
}

// serveCounted serves in's calls and counts those its handlers serve.
// before, if not nil, runs in front of in (to count attempts).
func serveCounted(t *testing.T, in *Interceptor, before grpc.UnaryServerInterceptor, copts ...grpc.DialOption) *counted {
	t.Helper()
	c := &counted{}
	unaries := []grpc.UnaryServerInterceptor{in.Unary(), func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		c.served.Add(1)
		return h(ctx, req)
	}}
	if before != nil {
		unaries = append([]grpc.UnaryServerInterceptor{before}, unaries...)
	}
	c.cc = serve(t, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unaries...),
		grpc.ChainStreamInterceptor(in.Stream(), func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			c.served.Add(1)
			return h(srv, ss)
		}),
	}, copts...)
	return c
}

// tenantCtx is a call context keyed, by KeyMetadata("x-tenant"), as
// tenant.
func tenantCtx(t *testing.T, tenant string) context.Context {
	return metadata.AppendToOutgoingContext(testCtx(t), "x-tenant", tenant)
}

// stream opens a stream, sends one message, closes and returns the
// stream's trailer and how it ended.
func stream(ctx context.Context, cc *grpc.ClientConn) (metadata.MD, error) {
	s, err := cc.NewStream(ctx, &streamDesc, methodStream)
	if err != nil {
		return nil, err
	}
	_ = s.SendMsg(new(emptypb.Empty))
	_ = s.CloseSend()
	err = s.RecvMsg(new(emptypb.Empty))
	return s.Trailer(), err
}

// errorLog collects the errors an interceptor reports.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) option() Option {
	return WithErrorFunc(func(_ context.Context, _ string, err error) {
		l.mu.Lock()
		l.errs = append(l.errs, err)
		l.mu.Unlock()
	})
}

// check reports whether every error logged wraps target and says has,
// and at least one was logged.
func (l *errorLog) check(t *testing.T, target error, has string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) == 0 {
		t.Errorf("no error reported, want errors wrapping %v", target)
	}
	for _, err := range l.errs {
		if !errors.Is(err, target) || !strings.Contains(err.Error(), has) {
			t.Errorf("reported %q, want an error wrapping %v that says %q", err, target, has)
		}
	}
}

// checkNoRetry checks that err is a status of code that tells a client
// not to retry: no RetryInfo, and a pushback of -1.
func checkNoRetry(t *testing.T, what string, err error, trailer metadata.MD, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
	if d, ok := retryInfo(err); ok {
		t.Errorf("%s: RetryInfo %v, want none", what, d)
	}
	if got := trailer.Get(PushbackTrailer); len(got) != 1 || got[0] != noRetry {
		t.Errorf("%s: trailer %s = %q, want [%q]", what, PushbackTrailer, got, noRetry)
	}
}

// TestInvalidLimitRefused: a LimitFunc's invalid answer serves no call of
// its key, on every tier and under every error policy: each is refused
// with ResourceExhausted and a pushback that forbids retries, and
// reported.
func TestInvalidLimitRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range rateTiers(s) {
		for _, bad := range invalidLimits {
			for _, pol := range errorPolicies {
				t.Run(tr.name+"/"+bad.name+"/"+pol.name, func(t *testing.T) {
					var log errorLog
					opts := append([]Option{WithKey(KeyMetadata("x-tenant")), log.option()}, pol.opts...)
					srv := serveCounted(t, mustNew(t, tr.make(t, planOf(bad.limit)), opts...), nil)
					srv.refuses(t, suspended, 3)
					log.check(t, tierlimit.ErrInvalidLimit, "refused")
					srv.servesAnother(t)
				})
			}
		}
	}
}

// TestLookupFailureRefused: a LimitLookup that fails for a key serves no
// call of it, on every tier and under every error policy: each is refused
// with ResourceExhausted and a pushback that forbids retries, and
// reported with the lookup's error.
func TestLookupFailureRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range lookupTiers(s) {
		for _, pol := range errorPolicies {
			t.Run(tr.name+"/"+pol.name, func(t *testing.T) {
				var log errorLog
				opts := append([]Option{WithKey(KeyMetadata("x-tenant")), log.option()}, pol.opts...)
				srv := serveCounted(t, mustNew(t, tr.make(t, nil), opts...), nil)
				srv.refuses(t, suspended, 3)
				log.check(t, tierlimit.ErrLimitLookup, "lookup of its key's limit failed")
				log.check(t, errPlansDown, "refused")
				srv.servesAnother(t)
			})
		}
	}
}

// TestShadowReportsRefusals: shadow mode serves what enforcing would
// refuse (its purpose: a mistake in what is rolled out refuses nothing)
// and reports each as a refusal; a blocked key's denials reach
// WithDecisionFunc.
func TestShadowReportsRefusals(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range rateTiers(s) {
		t.Run(tr.name, func(t *testing.T) {
			for _, tc := range []struct {
				name   string
				limit  tierlimit.Limit
				key    KeyFunc
				target error // reported; nil: none, a denial told to the DecisionFunc
			}{
				{"invalid limit", tierlimit.PerSecond(0), KeyMetadata("x-tenant"), tierlimit.ErrInvalidLimit},
				{"empty key", tierlimit.Limit{}, func(context.Context, string) (string, bool) { return "", true }, tierlimit.ErrInvalidKey},
				{"blocked", tierlimit.Blocked, KeyMetadata("x-tenant"), nil},
			} {
				var log errorLog
				var denials atomic.Int64
				in := mustNew(t, tr.make(t, planOf(tc.limit)), WithKey(tc.key), WithShadow(), WithFailClosed(), log.option(),
					WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
						if !res.Allowed {
							denials.Add(1)
						}
					}))
				srv := serveCounted(t, in, nil)
				if err := unary(tenantCtx(t, suspended), srv.cc); err != nil || srv.served.Load() != 1 {
					t.Errorf("%s: call %v, served %d; want served in shadow mode", tc.name, err, srv.served.Load())
				}
				if tc.target == nil {
					if denials.Load() != 1 {
						t.Errorf("%s: %d denials told to the DecisionFunc, want 1", tc.name, denials.Load())
					}
					continue
				}
				log.check(t, tc.target, "served in shadow mode")
			}
		})
	}
}

// blockingLimiter denies with a fixed Result.
type blockingLimiter struct{ res tierlimit.Result }

func (b blockingLimiter) AllowN(context.Context, string, int64) (tierlimit.Result, error) {
	return b.res, nil
}

// fastRetryConfig retries RESOURCE_EXHAUSTED up to 5 attempts, after
// backoffs of a millisecond: a client that is not told otherwise sends
// every attempt.
const fastRetryConfig = `{"methodConfig": [{
	"name": [{"service": "tierlimit.test.Echo"}],
	"retryPolicy": {
		"maxAttempts": 5,
		"initialBackoff": "0.001s",
		"maxBackoff": "0.001s",
		"backoffMultiplier": 1,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]
	}
}]}`

// TestBlockedKeyNotRetried: a grpc-go client with a retry policy for
// RESOURCE_EXHAUSTED sends exactly one attempt for a blocked key, on
// every tier, counted by the server; a denial without a RetryAfter is
// treated so too. The control, a denial with a RetryAfter, shows that the
// client retries when it is not told not to.
func TestBlockedKeyNotRetried(t *testing.T) {
	s := redistest.Start(t)
	type limiterOf func(t *testing.T) tierlimit.Limiter
	cases := []struct {
		name     string
		lim      limiterOf
		attempts int64
	}{
		{"control: a denial with a RetryAfter", func(*testing.T) tierlimit.Limiter {
			return blockingLimiter{tierlimit.Result{Limit: tierlimit.PerSecond(1), RetryAfter: time.Millisecond}}
		}, 5},
		{"a denial without a RetryAfter", func(*testing.T) tierlimit.Limiter {
			return blockingLimiter{tierlimit.Result{Limit: tierlimit.PerSecond(1)}}
		}, 1},
	}
	for _, tr := range rateTiers(s) {
		cases = append(cases, struct {
			name     string
			lim      limiterOf
			attempts int64
		}{"blocked by " + tr.name, func(t *testing.T) tierlimit.Limiter { return tr.make(t, planOf(tierlimit.Blocked)) }, 1})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var attempts atomic.Int64
			count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				attempts.Add(1)
				return h(ctx, req)
			}
			srv := serveCounted(t, mustNew(t, tc.lim(t), WithKey(KeyMetadata("x-tenant"))), count,
				grpc.WithDefaultServiceConfig(fastRetryConfig))
			var trailer metadata.MD
			err := unary(tenantCtx(t, suspended), srv.cc, grpc.Trailer(&trailer))
			if got := attempts.Load(); got != tc.attempts {
				t.Errorf("server saw %d attempts, want %d", got, tc.attempts)
			}
			if srv.served.Load() != 0 {
				t.Errorf("%d attempts served, want 0", srv.served.Load())
			}
			if tc.attempts == 1 {
				checkNoRetry(t, "call", err, trailer, codes.ResourceExhausted)
			}
		})
	}
}

// TestEmptyKeyRefused: a KeyFunc that returns an empty key with ok true
// gets no call served, under every error policy, with the concurrency
// limiter too: codes.Internal, reported as an invalid key.
func TestEmptyKeyRefused(t *testing.T) {
	empty := func(context.Context, string) (string, bool) { return "", true }
	conc, err := local.NewConcurrency(10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conc.Close() })
	for _, pol := range errorPolicies {
		for _, tc := range []struct {
			name string
			opts []Option
		}{
			{"first limiter", []Option{WithKey(empty)}},
			{"second limiter", []Option{WithKey(KeyMethod), WithLimiter("second", newLocal(t, tierlimit.PerSecond(100)), empty)}},
			{"message limiter", []Option{WithKey(KeyMethod), WithMessageLimiter("messages", newLocal(t, tierlimit.PerSecond(100)), empty)}},
			{"with concurrency", []Option{WithKey(empty), WithConcurrency(conc)}},
		} {
			t.Run(pol.name+"/"+tc.name, func(t *testing.T) {
				var log errorLog
				opts := append(append([]Option{log.option()}, pol.opts...), tc.opts...)
				lim := newLocal(t, tierlimit.PerSecond(100))
				srv := serveCounted(t, mustNew(t, lim, opts...), nil)
				ctx := testCtx(t)
				trailer, err := stream(ctx, srv.cc)
				checkNoRetry(t, "stream", err, trailer, codes.Internal)
				if tc.name == "message limiter" {
					// Its stream opens; the message is refused.
					srv.served.Store(0)
				} else {
					var trailer metadata.MD
					err := unary(ctx, srv.cc, grpc.Trailer(&trailer))
					checkNoRetry(t, "call", err, trailer, codes.Internal)
				}
				if got := srv.served.Load(); got != 0 {
					t.Errorf("%d calls served, want 0", got)
				}
				log.check(t, tierlimit.ErrInvalidKey, "empty key")
				if tc.name == "second limiter" {
					for _, m := range []string{methodUnary, methodStream} {
						if res, _ := lim.AllowN(ctx, m, 0); res.Remaining != 100 {
							t.Errorf("the limiter that admitted the refused %s holds %d of 100: not given back", m, res.Remaining)
						}
					}
				}
			})
		}
	}
}

// permitTier builds a concurrency limiter of one tier with f as its
// PermitFunc.
type permitTier struct {
	name string
	make func(t *testing.T, f tierlimit.PermitFunc) tierlimit.Concurrency
}

func permitTiers(s *redistest.Server) []permitTier {
	closing := func(t *testing.T, c interface {
		tierlimit.Concurrency
		Close() error
	}, err error) tierlimit.Concurrency {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return []permitTier{
		{"local", func(t *testing.T, f tierlimit.PermitFunc) tierlimit.Concurrency {
			c, err := local.NewConcurrency(4, local.WithPermitFunc(f))
			return closing(t, c, err)
		}},
		{"remote", func(t *testing.T, f tierlimit.PermitFunc) tierlimit.Concurrency {
			c, err := remote.NewConcurrency(s.Client(t), 4, remote.WithPermitFunc(f), remote.WithPermitPrefix(prefix()))
			return closing(t, c, err)
		}},
		{"hybrid", func(t *testing.T, f tierlimit.PermitFunc) tierlimit.Concurrency {
			c, err := hybrid.NewConcurrency(s.Client(t), 4, hybrid.WithPermitFunc(f), hybrid.WithPermitPrefix(prefix()),
				hybrid.WithPermitCallBudget(slowRedis))
			return closing(t, c, err)
		}},
	}
}

// invalidPermits are PermitFunc answers outside 1 to MaxPermits that are
// neither NoPermits nor DefaultPermits.
var invalidPermits = []int64{-2, tierlimit.MaxPermits + 1}

// TestInvalidPermitsRefused: a PermitFunc's invalid answer serves no call
// of its key, on every tier and under every error policy.
func TestInvalidPermitsRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range permitTiers(s) {
		for _, n := range invalidPermits {
			for _, pol := range errorPolicies {
				t.Run(fmt.Sprintf("%s/%d/%s", tr.name, n, pol.name), func(t *testing.T) {
					conc := tr.make(t, func(key string) int64 {
						if key == suspended {
							return n
						}
						return tierlimit.DefaultPermits
					})
					var log errorLog
					opts := append([]Option{WithKey(KeyMetadata("x-tenant")), WithConcurrency(conc), log.option()}, pol.opts...)
					srv := serveCounted(t, mustNew(t, newLocal(t, tierlimit.PerSecond(100)), opts...), nil)
					srv.refuses(t, suspended, 1)
					log.check(t, tierlimit.ErrInvalidLimit, "refused")
					srv.servesAnother(t)
				})
			}
		}
	}
}

// TestNoPermitsRefused: a key its PermitFunc blocks (tierlimit.NoPermits)
// serves no call, on every tier, refused as one that finds no permit free:
// ResourceExhausted without RetryInfo or pushback, and no error reported,
// since a blocked key is a refusal, not a fault.
func TestNoPermitsRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range permitTiers(s) {
		t.Run(tr.name, func(t *testing.T) {
			conc := tr.make(t, func(key string) int64 {
				if key == suspended {
					return tierlimit.NoPermits
				}
				return tierlimit.DefaultPermits
			})
			var log errorLog
			srv := serveCounted(t, mustNew(t, newLocal(t, tierlimit.PerSecond(100)), WithKey(KeyMetadata("x-tenant")), WithConcurrency(conc), log.option()), nil)
			ctx := tenantCtx(t, suspended)
			var trailer metadata.MD
			err := unary(ctx, srv.cc, grpc.Trailer(&trailer))
			if got := status.Code(err); got != codes.ResourceExhausted {
				t.Errorf("call: %v, want ResourceExhausted", err)
			}
			if d, ok := retryInfo(err); ok {
				t.Errorf("RetryInfo %v, want none", d)
			}
			if got := trailer.Get(PushbackTrailer); len(got) != 0 {
				t.Errorf("trailer %s = %q, want none", PushbackTrailer, got)
			}
			if _, err := stream(ctx, srv.cc); status.Code(err) != codes.ResourceExhausted {
				t.Errorf("stream: %v, want ResourceExhausted", err)
			}
			if got := srv.served.Load(); got != 0 {
				t.Errorf("%d calls of the suspended tenant served, want 0", got)
			}
			if len(log.errs) != 0 {
				t.Errorf("errors reported %v, want none", log.errs)
			}
			if err := unary(tenantCtx(t, "tenant-paying"), srv.cc); err != nil || srv.served.Load() != 1 {
				t.Errorf("call of another tenant: %v, served %d; want served", err, srv.served.Load())
			}
		})
	}
}

// fullConc is a concurrency limiter whose keys have every permit out.
type fullConc struct{}

func (fullConc) Acquire(ctx context.Context, _ string) (tierlimit.Permit, error) {
	<-ctx.Done()
	return tierlimit.Permit{}, ctx.Err()
}

func (fullConc) TryAcquire(context.Context, string) (tierlimit.Permit, bool, error) {
	return tierlimit.Permit{}, false, nil
}

// TestConcurrencyRefusalSaysSo: a call refused for want of a permit says
// the concurrency limit refused it, with no retry delay it could not
// keep: no RetryInfo and no pushback, so a client backs off by its own
// policy.
func TestConcurrencyRefusalSaysSo(t *testing.T) {
	srv := serveCounted(t, mustNew(t, newLocal(t, tierlimit.PerSecond(100)), WithKey(KeyMethod), WithConcurrency(fullConc{})), nil)
	var trailer metadata.MD
	err := unary(testCtx(t), srv.cc, grpc.Trailer(&trailer))
	if got := status.Code(err); got != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "in flight") {
		t.Errorf("call: %v, want ResourceExhausted saying too many calls are in flight", err)
	}
	if d, ok := retryInfo(err); ok {
		t.Errorf("RetryInfo %v, want none", d)
	}
	if got := trailer.Get(PushbackTrailer); len(got) != 0 {
		t.Errorf("trailer %s = %q, want none", PushbackTrailer, got)
	}
	if srv.served.Load() != 0 {
		t.Errorf("%d calls served, want 0", srv.served.Load())
	}
}
