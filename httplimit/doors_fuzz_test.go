package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// answer is what a limiter or concurrency limiter answered a request.
type answer struct {
	key     string
	allowed bool
	err     error
}

// answers records what the limiters of one request answered.
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
// *rec, the request's.
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

// FuzzDoors serves one request through a Middleware of a real local
// limiter and concurrency limiter whose LimitFunc, PermitFunc and KeyFunc
// answer what the fuzzer says (invalid limits, Blocked, empty and huge
// keys, any permits), with proxy headers, a cost and shadow mode on or
// off. No input panics, and none gets an unlimited request: a request
// served outside shadow mode was exempted by its KeyFunc, or admitted by
// the limiter and given a permit, both asked with a non-empty key. A
// KeyFunc's empty key is a 500; a refusal never says Retry-After: 0; the
// fields parse as structured fields, and a concurrency refusal has none.
func FuzzDoors(f *testing.F) {
	f.Add("tenant", true, "192.0.2.1:1", "198.51.100.1, 10.0.0.9", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("", true, "10.0.0.1:80", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("", false, "", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("suspended", true, "192.0.2.1:1", "", int64(0), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("blocked", true, "192.0.2.1:1", "", int64(0), int64(0), int64(-1), int64(0), int64(1), false)
	f.Add("blocked", true, "192.0.2.1:1", "", int64(0), int64(0), int64(-1), int64(0), int64(1), true)
	f.Add("suspended", true, "192.0.2.1:1", "", int64(-3), int64(0), int64(-2), int64(0), int64(1), true)
	f.Add("permits", true, "192.0.2.1:1", "", int64(10), int64(1_000_000), int64(0), int64(-1), int64(1), false)
	f.Add("permits", true, "192.0.2.1:1", "", int64(10), int64(1_000_000), int64(0), int64(tierlimit.MaxPermits+1), int64(1), false)
	f.Add("costly", true, "192.0.2.1:1", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(11), false)
	f.Add("free", true, "192.0.2.1:1", "", int64(1), int64(60_000_000), int64(0), int64(0), int64(0), false)
	f.Add("drained", true, "192.0.2.1:1", "", int64(1), int64(3_600_000_000), int64(0), int64(0), int64(1), false)
	f.Add(strings.Repeat("k", tierlimit.MaxKeyLen+1), true, "[2001:db8::1]:443", "", int64(10), int64(1_000_000), int64(0), int64(0), int64(1), false)
	f.Add("t", true, "10.0.0.1:1", strings.Repeat("10.0.0.2, ", 20), int64(1<<50), int64(1), int64(1<<55), int64(1), int64(-1), false)

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

	f.Fuzz(func(t *testing.T, key string, ok bool, remote, xff string, rate, periodMicros, burst, permits, cost int64, shadow bool) {
		l := tierlimit.Limit{Rate: rate, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
		limit.Store(&l)
		perKey.Store(permits)
		a := &answers{}
		rec.Store(a)
		opts := []Option{
			WithKey(func(*http.Request, string) (string, bool) { return key, ok }),
			WithConcurrency(recordingConc{conc, &rec}),
			WithCost(func(*http.Request) int64 { return cost }),
			WithTrustedProxies("10.0.0.0/8"),
			WithLegacyHeaders(),
			WithErrorFunc(func(*http.Request, error) {}),
		}
		if shadow {
			opts = append(opts, WithShadow())
		}
		m, err := New(recordingLimiter{lim, &rec}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		served := false
		h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header[HeaderXForwardedFor] = strings.Split(xff, "\n")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)

		switch w.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusInternalServerError:
		default:
			t.Fatalf("status %d", w.Code)
		}
		if served != (w.Code == http.StatusOK) {
			t.Fatalf("status %d, served %v", w.Code, served)
		}
		if ok && key == "" && !shadow && w.Code != http.StatusInternalServerError {
			t.Errorf("KeyFunc's empty key: status %d, want 500", w.Code)
		}
		if served && !shadow && ok {
			checkAdmitted(t, "limiter", a.rate)
			checkAdmitted(t, "concurrency limiter", a.conc)
		}
		if ra, has := w.Header()[hRetryAfter]; has {
			if n, err := strconv.ParseInt(ra[0], 10, 64); err != nil || n < 1 || w.Code != http.StatusTooManyRequests {
				t.Errorf("Retry-After %q on a %d, want a number of seconds of at least 1 on a 429", ra, w.Code)
			}
		}
		concRefused := len(a.conc) > 0 && !a.conc[0].allowed
		for _, field := range []string{hPolicy, hRateLimit} {
			v, has := w.Header()[field]
			if !has {
				continue
			}
			if concRefused && !shadow {
				t.Errorf("%s %q on a refusal of the concurrency limiter, want none", field, v)
			}
			if _, err := httpsfv.UnmarshalList(v); err != nil {
				t.Errorf("%s %q does not parse: %v", field, v, err)
			}
		}
	})
}

// checkAdmitted checks that a served request was asked of a limiter, with
// a non-empty key no longer than tierlimit.MaxKeyLen, and admitted.
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
