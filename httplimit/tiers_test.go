package httplimit

import (
	"errors"
	"github.com/tierlimit/tierlimit/internal/chain"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/local"
	"github.com/tierlimit/tierlimit/remote"
)

// Every tier gives a refused request's charge back (Middleware.giveBack, chain.GiveBack).
var (
	_ chain.Settler = (*local.Limiter)(nil)
	_ chain.Settler = (*hybrid.Limiter)(nil)
	_ chain.Settler = (*remote.TokenBucket)(nil)
	_ chain.Settler = (*remote.GCRA)(nil)
	_ chain.Settler = (*remote.FixedWindow)(nil)
	_ chain.Settler = (*remote.AnchoredWindow)(nil)
	_ chain.Settler = (*remote.SlidingLog)(nil)
	_ chain.Settler = (*remote.SlidingWindow)(nil)
)

// TestRemoteWithLimits runs the middleware over a remote token bucket
// with two limits on one key (remote.WithLimits): the fields name the
// limit that decided each request, so that 2/s and 5/min never show
// under one name, and t is that limit's next token.
func TestRemoteWithLimits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	now := time.Unix(1_700_000_000, 0)
	mr.SetTime(now)
	lim, err := remote.NewTokenBucket(rdb, tierlimit.PerSecond(2), remote.WithLimits(tierlimit.PerMinute(5)))
	if err != nil {
		t.Fatal(err)
	}
	m := mustNew(t, lim)
	for i, step := range []struct {
		after     time.Duration // since the previous request
		code      int
		policy    string
		rateLimit string
	}{
		{0, 200, `"default:2/1s";q=2;w=1`, `"default:2/1s";r=1;t=1`},
		{0, 200, `"default:2/1s";q=2;w=1`, `"default:2/1s";r=0;t=1`},
		{time.Second, 200, `"default:2/1s";q=2;w=1`, `"default:2/1s";r=1;t=1`},
		{0, 200, `"default:2/1s";q=2;w=1`, `"default:2/1s";r=0;t=1`},
		// 4 of 5 a minute spent: the minute's limit now decides.
		{time.Second, 200, `"default:5/1m";q=5;w=60`, `"default:5/1m";r=0;t=10`}, // 2 s of 12 refilled
		{0, 429, `"default:5/1m";q=5;w=60`, `"default:5/1m";r=0;t=10`},
	} {
		now = now.Add(step.after)
		mr.SetTime(now)
		w := serve(m, request("192.0.2.1:1"))
		if w.Code != step.code {
			t.Errorf("request %d: got %d, want %d", i+1, w.Code, step.code)
		}
		checkField(t, w.Header(), "RateLimit-Policy", step.policy)
		checkField(t, w.Header(), "RateLimit", step.rateLimit)
	}
}

// tenantPlans is a LimitFunc: "bad" gets an invalid limit (a suspended
// plan written as PerSecond(0)), "off" is blocked, others the default.
func tenantPlans(key string) tierlimit.Limit {
	switch key {
	case "bad":
		return tierlimit.PerSecond(0)
	case "off":
		return tierlimit.Blocked
	}
	return tierlimit.Limit{}
}

// tier is one limiter of the module, built with tenantPlans.
type tier struct {
	name string
	new  func(t *testing.T) tierlimit.Limiter
}

// tiers lists every tier of the module, each with tenantPlans.
func tiers() []tier {
	def := tierlimit.PerSecond(10)
	mini := func(t *testing.T) *redis.Client {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	must := func(t *testing.T, l tierlimit.Limiter, err error) tierlimit.Limiter {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	return []tier{
		{"local", func(t *testing.T) tierlimit.Limiter {
			l, err := local.New(def, local.WithLimitFunc(tenantPlans))
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return must(t, l, err)
		}},
		{"remote.TokenBucket", func(t *testing.T) tierlimit.Limiter {
			l, err := remote.NewTokenBucket(mini(t), def, remote.WithLimitFunc(tenantPlans))
			return must(t, l, err)
		}},
		{"remote.SlidingWindow", func(t *testing.T) tierlimit.Limiter {
			l, err := remote.NewSlidingWindow(mini(t), def, remote.WithLimitFunc(tenantPlans))
			return must(t, l, err)
		}},
		{"hybrid", func(t *testing.T) tierlimit.Limiter {
			l, err := hybrid.New(mini(t), def, hybrid.WithLimitFunc(tenantPlans))
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return must(t, l, err)
		}},
	}
}

// TestTiersRefuse: on every tier, a key whose LimitFunc answer is invalid
// is refused, 429 without Retry-After, never let through (a suspended
// tenant written as PerSecond(0) once had the run of the service), and the
// error func is told that the request was refused; a key its LimitFunc
// blocks (tierlimit.Blocked) is refused the same way, with no error and no
// t; a good key of the same limiter still passes.
func TestTiersRefuse(t *testing.T) {
	for _, tr := range tiers() {
		for _, key := range []string{"bad", "off"} {
			t.Run(tr.name+"/"+key, func(t *testing.T) {
				var errs []error
				m := mustNew(t, tr.new(t), WithKey(KeyHeader("X-Tenant")),
					WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))
				for i := 0; i < 3; i++ {
					w := serve(m, request("192.0.2.1:1", "X-Tenant", key))
					if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "" {
						t.Errorf("request %d: got %d, Retry-After %q; want 429 without Retry-After",
							i+1, w.Code, w.Header().Get("Retry-After"))
					}
					if key == "off" {
						checkField(t, w.Header(), "RateLimit", `"default";r=0`)
					}
				}
				// A good key passes. Its first request is the first Redis call
				// of the Redis tiers: on a loaded machine it may run past the
				// call budget, and hybrid then denies it with a Retry-After
				// (CI under -race): a denial for slowness, not a refusal.
				passed := false
				for i := 0; i < 5 && !passed; i++ {
					w := serve(m, request("192.0.2.1:1", "X-Tenant", "good"))
					switch {
					case w.Code == http.StatusOK:
						passed = true
					case w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "":
						t.Fatalf("a good key: got %d, Retry-After %q; want 200, or 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
					}
				}
				if !passed {
					t.Errorf("a good key: got no 200 in 5 requests")
				}
				wantErrs := 3
				if key == "off" {
					wantErrs = 0 // a blocked key is no error
				}
				if len(errs) != wantErrs {
					t.Fatalf("error func saw %d errors, want %d: %v", len(errs), wantErrs, errs)
				}
				for _, err := range errs {
					if !errors.Is(err, tierlimit.ErrInvalidLimit) || !strings.Contains(err.Error(), "refused with 429") {
						t.Errorf("error func saw %q, want an ErrInvalidLimit saying the request was refused", err)
					}
				}
			})
		}
	}
}
