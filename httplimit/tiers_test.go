package httplimit

import (
	"github.com/tierlimit/tierlimit/internal/chain"
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
