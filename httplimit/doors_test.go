package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// The tests of this file are the doors of the design's section 7: what a
// user function gets wrong, and a key that may never pass, are denials
// with no Retry-After, on every tier and under every error policy.

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

// errorPolicies are the ways the middleware treats a failing limiter.
var errorPolicies = []struct {
	name string
	opts []Option
}{
	{"fail open", nil},
	{"fail closed", []Option{WithFailClosed(nil)}},
}

// slowRedis is the hybrid limiters' call budget: on a loaded machine a
// slow answer of Redis must not become a fallback decision, since these
// tests are about what the doors do with the limiters' answers, not about
// outages.
const slowRedis = 5 * time.Second

// prefixes makes each limiter's Redis prefix its own.
var prefixes atomic.Int64

func prefix() string { return fmt.Sprintf("doors%d:", prefixes.Add(1)) }

// closer is a limiter with a Close.
type closer interface{ Close() error }

// closing returns v, closed at t's end, or fails t with err.
func closing[T closer](t *testing.T, v T, err error) T {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// rateTier builds a limiter of one tier with f as its LimitFunc.
type rateTier struct {
	name string
	make func(t *testing.T, f tierlimit.LimitFunc) tierlimit.Limiter
}

// rateTiers returns a tier for local, remote (token bucket and GCRA) and
// hybrid, the last three on s: one redis-server per test, a prefix per
// limiter.
func rateTiers(s *redistest.Server) []rateTier {
	def := tierlimit.PerSecond(100)
	return []rateTier{
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

// remoteNew is a remote constructor, returning a tierlimit.Limiter.
type remoteNew func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (tierlimit.Limiter, error)

// adapt returns a remote constructor as a remoteNew.
func adapt[L tierlimit.Limiter](mk func(redis.UniversalClient, tierlimit.Limit, ...remote.Option) (L, error)) remoteNew {
	return func(rdb redis.UniversalClient, l tierlimit.Limit, opts ...remote.Option) (tierlimit.Limiter, error) {
		r, err := mk(rdb, l, opts...)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// lookupTiers returns a tier for local, every remote algorithm and hybrid
// whose LimitLookup is downLookup (failing closed, the default), on s;
// make's LimitFunc is ignored.
func lookupTiers(s *redistest.Server) []rateTier {
	def := tierlimit.PerSecond(100)
	tiers := []rateTier{
		{"local", func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := local.New(def, local.WithLimitLookup(downLookup))
			return closing(t, l, err)
		}},
		{"hybrid", func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := hybrid.New(s.Client(t), def, hybrid.WithLimitLookup(downLookup), hybrid.WithPrefix(prefix()),
				hybrid.WithCallBudget(slowRedis))
			return closing(t, l, err)
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
		tiers = append(tiers, rateTier{r.name, func(t *testing.T, _ tierlimit.LimitFunc) tierlimit.Limiter {
			l, err := r.mk(s.Client(t), def, remote.WithLimitLookup(downLookup), remote.WithPrefix(prefix()))
			if err != nil {
				t.Fatal(err)
			}
			return l
		}})
	}
	return tiers
}

// permitTier builds a concurrency limiter of one tier with f as its
// PermitFunc.
type permitTier struct {
	name string
	make func(t *testing.T, f tierlimit.PermitFunc) tierlimit.Concurrency
}

func permitTiers(s *redistest.Server) []permitTier {
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

// counted is a Middleware's handler in front of one that counts the
// requests it serves.
type counted struct {
	h      http.Handler
	served atomic.Int64
}

func newCounted(m *Middleware) *counted {
	c := &counted{}
	c.h = m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { c.served.Add(1) }))
	return c
}

// get serves a request of tenant (header X-Tenant).
func (c *counted) get(tenant string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	w := httptest.NewRecorder()
	c.h.ServeHTTP(w, r)
	return w
}

// errorLog collects the errors a middleware reports.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) option() Option {
	return WithErrorFunc(func(_ *http.Request, err error) {
		l.mu.Lock()
		l.errs = append(l.errs, err)
		l.mu.Unlock()
	})
}

// check checks that at least one error was logged, and every one wraps
// target and says has.
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

// checkRefused checks that w refused a request with code and no
// Retry-After; fields, when false, that it carries no RateLimit field.
func checkRefused(t *testing.T, what string, w *httptest.ResponseRecorder, code int, fields bool) {
	t.Helper()
	if w.Code != code {
		t.Errorf("%s: got %d, want %d", what, w.Code, code)
	}
	if ra, ok := w.Header()[hRetryAfter]; ok {
		t.Errorf("%s: Retry-After %q, want none", what, ra)
	}
	if fields {
		return
	}
	for _, k := range []string{hPolicy, hRateLimit, hXLimit, hXRemaining, hXReset} {
		if v, ok := w.Header()[k]; ok {
			t.Errorf("%s: %s %q, want none", what, k, v)
		}
	}
}

// TestInvalidLimitRefused: a LimitFunc's invalid answer serves no request
// of its key, on every tier and under every error policy: 429 without
// Retry-After, and reported.
func TestInvalidLimitRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range rateTiers(s) {
		for _, bad := range invalidLimits {
			for _, pol := range errorPolicies {
				t.Run(tr.name+"/"+bad.name+"/"+pol.name, func(t *testing.T) {
					var log errorLog
					opts := append([]Option{WithKey(KeyHeader("X-Tenant")), log.option()}, pol.opts...)
					c := newCounted(mustNew(t, tr.make(t, planOf(bad.limit)), opts...))
					for i := range 3 {
						checkRefused(t, fmt.Sprintf("request %d", i), c.get(suspended), http.StatusTooManyRequests, true)
					}
					if got := c.served.Load(); got != 0 {
						t.Errorf("%d requests of the suspended tenant served, want 0", got)
					}
					log.check(t, tierlimit.ErrInvalidLimit, "refused with 429")
					if w := c.get("tenant-paying"); w.Code != http.StatusOK || c.served.Load() != 1 {
						t.Errorf("request of another tenant: %d, served %d; want 200, served", w.Code, c.served.Load())
					}
				})
			}
		}
	}
}

// TestLookupFailureRefused: a LimitLookup that fails for a key serves no
// request of it, on every tier and under every error policy: 429 without
// Retry-After, reported with the lookup's error.
func TestLookupFailureRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range lookupTiers(s) {
		for _, pol := range errorPolicies {
			t.Run(tr.name+"/"+pol.name, func(t *testing.T) {
				var log errorLog
				opts := append([]Option{WithKey(KeyHeader("X-Tenant")), log.option()}, pol.opts...)
				c := newCounted(mustNew(t, tr.make(t, nil), opts...))
				for i := range 3 {
					checkRefused(t, fmt.Sprintf("request %d", i), c.get(suspended), http.StatusTooManyRequests, true)
				}
				if got := c.served.Load(); got != 0 {
					t.Errorf("%d requests of the tenant whose lookup failed served, want 0", got)
				}
				log.check(t, tierlimit.ErrLimitLookup, "lookup of its key's limit failed")
				log.check(t, errPlansDown, "refused with 429")
				if w := c.get("tenant-paying"); w.Code != http.StatusOK || c.served.Load() != 1 {
					t.Errorf("request of another tenant: %d, served %d; want 200, served", w.Code, c.served.Load())
				}
			})
		}
	}
}

// TestInvalidPermitsRefused: a PermitFunc's invalid answer serves no
// request of its key, on every tier and under every error policy: 429
// without Retry-After or the fields of the rate limiter, which admitted
// it.
func TestInvalidPermitsRefused(t *testing.T) {
	s := redistest.Start(t)
	for _, tr := range permitTiers(s) {
		for _, n := range []int64{-2, tierlimit.MaxPermits + 1} {
			for _, pol := range errorPolicies {
				t.Run(fmt.Sprintf("%s/%d/%s", tr.name, n, pol.name), func(t *testing.T) {
					conc := tr.make(t, func(key string) int64 {
						if key == suspended {
							return n
						}
						return tierlimit.DefaultPermits
					})
					var log errorLog
					opts := append([]Option{WithKey(KeyHeader("X-Tenant")), WithConcurrency(conc), WithLegacyHeaders(), log.option()}, pol.opts...)
					c := newCounted(mustNew(t, newFake(tierlimit.PerSecond(100), time.Second, time.Second), opts...))
					for i := range 3 {
						checkRefused(t, fmt.Sprintf("request %d", i), c.get(suspended), http.StatusTooManyRequests, false)
					}
					if got := c.served.Load(); got != 0 {
						t.Errorf("%d requests of the suspended tenant served, want 0", got)
					}
					log.check(t, tierlimit.ErrInvalidLimit, "refused with 429")
					if w := c.get("tenant-paying"); w.Code != http.StatusOK || c.served.Load() != 1 {
						t.Errorf("request of another tenant: %d, served %d; want 200, served", w.Code, c.served.Load())
					}
				})
			}
		}
	}
}

// TestNoPermitsRefused: a key its PermitFunc blocks (tierlimit.NoPermits)
// serves no request, on every tier: 429 without Retry-After, and no error
// reported, since a blocked key is a refusal, not a fault.
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
			c := newCounted(mustNew(t, newFake(tierlimit.PerSecond(100), time.Second, time.Second),
				WithKey(KeyHeader("X-Tenant")), WithConcurrency(conc), WithLegacyHeaders(), log.option()))
			for i := range 3 {
				checkRefused(t, fmt.Sprintf("request %d", i), c.get(suspended), http.StatusTooManyRequests, false)
			}
			if got := c.served.Load(); got != 0 {
				t.Errorf("%d requests of the suspended tenant served, want 0", got)
			}
			if len(log.errs) != 0 {
				t.Errorf("errors reported %v, want none", log.errs)
			}
			if w := c.get("tenant-paying"); w.Code != http.StatusOK || c.served.Load() != 1 {
				t.Errorf("request of another tenant: %d, served %d; want 200, served", w.Code, c.served.Load())
			}
		})
	}
}

// denyingLimiter denies with a fixed Result.
type denyingLimiter struct{ res tierlimit.Result }

func (d denyingLimiter) AllowN(context.Context, string, int64) (tierlimit.Result, error) {
	return d.res, nil
}

// TestNoRetryAfterZero: a blocked key, on every tier, and a denial
// without a RetryAfter are refused with no Retry-After: never
// "Retry-After: 0", which a client would take as leave to retry at once.
func TestNoRetryAfterZero(t *testing.T) {
	s := redistest.Start(t)
	type denial struct {
		name       string
		lim        func(t *testing.T) tierlimit.Limiter
		retryAfter string // "": none
	}
	cases := []denial{
		{"a denial without a RetryAfter", func(*testing.T) tierlimit.Limiter {
			return denyingLimiter{tierlimit.Result{Limit: tierlimit.PerSecond(1)}}
		}, ""},
		{"control: a RetryAfter under a second", func(*testing.T) tierlimit.Limiter {
			return denyingLimiter{tierlimit.Result{Limit: tierlimit.PerSecond(1), RetryAfter: time.Nanosecond}}
		}, "1"},
	}
	for _, tr := range rateTiers(s) {
		cases = append(cases, denial{"blocked by " + tr.name, func(t *testing.T) tierlimit.Limiter { return tr.make(t, planOf(tierlimit.Blocked)) }, ""})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCounted(mustNew(t, tc.lim(t), WithKey(KeyHeader("X-Tenant"))))
			w := c.get(suspended)
			if w.Code != http.StatusTooManyRequests || c.served.Load() != 0 {
				t.Errorf("got %d, served %d; want 429, not served", w.Code, c.served.Load())
			}
			if got := w.Header().Get(hRetryAfter); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
		})
	}
}

// emptyKey is a KeyFunc with a bug: an empty key for a limited request.
func emptyKey(*http.Request, string) (string, bool) { return "", true }

// TestEmptyKeyRefused: a KeyFunc that returns an empty key with ok true
// gets no request served, under every error policy, with the concurrency
// limiter too: 500, reported as an invalid key, and what an earlier
// limiter charged is given back.
func TestEmptyKeyRefused(t *testing.T) {
	conc, err := local.NewConcurrency(10)
	conc = closing(t, conc, err)
	for _, pol := range errorPolicies {
		for _, tc := range []struct {
			name string
			opts []Option
		}{
			{"first limiter", []Option{WithKey(emptyKey)}},
			{"second limiter", []Option{WithLimiter("second", newFake(tierlimit.PerSecond(100), 0, 0), emptyKey)}},
			{"with concurrency", []Option{WithKey(emptyKey), WithConcurrency(conc)}},
		} {
			t.Run(pol.name+"/"+tc.name, func(t *testing.T) {
				var log errorLog
				first := settlingFake{newFake(tierlimit.PerSecond(100), 0, 0)}
				opts := append(append([]Option{log.option()}, pol.opts...), tc.opts...)
				c := newCounted(mustNew(t, first, opts...))
				for i := range 3 {
					checkRefused(t, fmt.Sprintf("request %d", i), c.get("t"), http.StatusInternalServerError, false)
				}
				if got := c.served.Load(); got != 0 {
					t.Errorf("%d requests served, want 0", got)
				}
				log.check(t, tierlimit.ErrInvalidKey, "empty key")
				if got := first.charged("192.0.2.1"); got != 0 {
					t.Errorf("the first limiter keeps a charge of %d for refused requests, want 0", got)
				}
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
				{"invalid limit", tierlimit.PerSecond(0), KeyHeader("X-Tenant"), tierlimit.ErrInvalidLimit},
				{"empty key", tierlimit.Limit{}, emptyKey, tierlimit.ErrInvalidKey},
				{"blocked", tierlimit.Blocked, KeyHeader("X-Tenant"), nil},
			} {
				var log errorLog
				var denials atomic.Int64
				conc, err := local.NewConcurrency(1)
				conc = closing(t, conc, err)
				m := mustNew(t, tr.make(t, planOf(tc.limit)), WithKey(tc.key), WithShadow(), WithFailClosed(nil), WithConcurrency(conc), log.option(),
					WithDecisionFunc(func(_ context.Context, _ string, res tierlimit.Result) {
						if !res.Allowed {
							denials.Add(1)
						}
					}))
				c := newCounted(m)
				if w := c.get(suspended); w.Code != http.StatusOK || c.served.Load() != 1 {
					t.Errorf("%s: got %d, served %d; want 200, served in shadow mode", tc.name, w.Code, c.served.Load())
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

// TestConcurrencyRefusalSaysSo: a request refused for want of a permit
// says the concurrency limit refused it, with no Retry-After and none of
// the rate limiter's fields (they describe a limit that admitted it);
// WithConcurrencyDeniedHandler answers it in place of the default.
func TestConcurrencyRefusalSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []Option
		code    int
		bodyHas string
	}{
		{"default", nil, http.StatusTooManyRequests, "in flight"},
		{"own handler", []Option{WithConcurrencyDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}))}, http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conc, err := local.NewConcurrency(1)
			conc = closing(t, conc, err)
			opts := append([]Option{WithKey(KeyHeader("X-Tenant")), WithConcurrency(conc), WithLegacyHeaders()}, tc.opts...)
			m := mustNew(t, newFake(tierlimit.PerSecond(100), time.Second, time.Second), opts...)
			var inner *httptest.ResponseRecorder
			h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				if inner == nil {
					// The tenant's one permit is held: a second request of
					// it is refused.
					inner = httptest.NewRecorder()
					r := httptest.NewRequest("GET", "/", nil)
					r.Header.Set("X-Tenant", "t")
					m.Handler(http.NotFoundHandler()).ServeHTTP(inner, r)
				}
			}))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-Tenant", "t")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK || w.Header().Get(hRateLimit) == "" {
				t.Fatalf("the first request: %d, RateLimit %q; want 200 with the field", w.Code, w.Header().Get(hRateLimit))
			}
			checkRefused(t, "the second request", inner, tc.code, false)
			if !strings.Contains(inner.Body.String(), tc.bodyHas) {
				t.Errorf("body %q, want it to say %q", inner.Body.String(), tc.bodyHas)
			}
		})
	}
}
