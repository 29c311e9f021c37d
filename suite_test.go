package tierlimit_test

// The one behaviour suite over every tier: local, each remote algorithm and
// hybrid, with default options and go-redis's default client on a real
// Redis.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestEveryTier: on each tier, at 3 per 3 s (bad input is
// TestInputRules's): a peek charges nothing; 3 calls are admitted and the
// 4th denied with an honest RetryAfter (the time to the next token, or to
// the window's end); waiting it, a caller alone on the key is admitted;
// Reset makes the key full again; after Close every call is ErrClosed.
func TestEveryTier(t *testing.T) {
	s := redistest.Start(t)
	limit := tierlimit.Limit{Rate: 3, Period: 3 * time.Second}
	every := limit.Period / time.Duration(limit.Rate)
	for _, tier := range tiers {
		t.Run(tier.name, func(t *testing.T) {
			t.Parallel()
			// The tiers share one Redis, and the hybrid tier's bucket is
			// the remote token bucket's: each tier has a key of its own.
			key := "k:" + tier.name
			ctx := context.Background()
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
			defer rdb.Close()
			l, err := tier.new(rdb, limit, tierOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()

			if tier.window {
				// Start just after a window boundary, so that the drain
				// below stays within one fixed window.
				time.Sleep(limit.Period - time.Duration(time.Now().UnixNano())%limit.Period + 10*time.Millisecond)
			}
			for range 2 {
				if r, err := l.AllowN(ctx, key, 0); err != nil || !r.Allowed || r.Remaining != limit.Capacity() {
					t.Fatalf("peek of a fresh key = %+v, %v; want allowed, %d remaining, and no charge", r, err, limit.Capacity())
				}
			}
			began := time.Now()
			for i := range limit.Capacity() {
				if r, err := l.AllowN(ctx, key, 1); err != nil || !r.Allowed {
					t.Fatalf("call %d of %d = %+v, %v; want allowed", i+1, limit.Capacity(), r, err)
				}
			}
			// A loaded machine may take longer than a token's refill to
			// make the calls: a token that came back meanwhile is admitted,
			// and the drain goes on until a call is denied.
			var r tierlimit.Result
			var elapsed time.Duration
			for extra := int64(0); ; extra++ {
				r, err = l.AllowN(ctx, key, 1)
				elapsed = time.Since(began)
				switch {
				case err != nil:
					t.Fatal(err)
				case r.Allowed && elapsed < every*time.Duration(extra+1):
					t.Fatalf("call %d within %v = allowed, want denied (%d came back at most)", limit.Capacity()+extra+1, elapsed, extra)
				case r.Allowed && extra < 2*limit.Capacity():
					continue
				case r.Allowed:
					t.Fatalf("%d calls past the capacity admitted in %v", extra+1, elapsed)
				}
				break
			}
			// The time to the next token: the exact wait when the drain took
			// less than a token's refill, else at most a token's refill.
			lo, hi := max(every-elapsed, 1), every
			switch {
			case tier.name == "remote sliding window":
				lo, hi = 1, limit.Period+every
			case tier.window:
				lo, hi = 1, limit.Period
			}
			if r.RetryAfter < lo || r.RetryAfter > hi {
				t.Errorf("RetryAfter = %v %v after draining, want in [%v, %v]", r.RetryAfter, elapsed, lo, hi)
			}
			time.Sleep(r.RetryAfter)
			// A claim that runs past hybrid's call budget on a loaded
			// machine is not an outage: its caller is denied for a
			// budget's time (Source fallback) and the claim lands for the
			// next call. A caller that waits what it is told is admitted.
			r2, err := l.AllowN(ctx, key, 1)
			for slow := 0; err == nil && !r2.Allowed && r2.Source == tierlimit.SourceFallback && slow < 10; slow++ {
				time.Sleep(r2.RetryAfter)
				r2, err = l.AllowN(ctx, key, 1)
			}
			if err != nil || !r2.Allowed {
				t.Errorf("after waiting RetryAfter %v: %+v, %v; want allowed", r.RetryAfter, r2, err)
			}

			if err := l.Reset(ctx, key); err != nil {
				t.Fatal(err)
			}
			if r, err := l.AllowN(ctx, key, limit.Capacity()); err != nil || !r.Allowed {
				t.Errorf("AllowN(burst) after Reset = %+v, %v; want allowed", r, err)
			}

			if !tier.closable {
				return
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.AllowN(ctx, key, 1); !errors.Is(err, tierlimit.ErrClosed) {
				t.Errorf("AllowN after Close = %v, want ErrClosed", err)
			}
			if err := l.Reset(ctx, key); !errors.Is(err, tierlimit.ErrClosed) {
				t.Errorf("Reset after Close = %v, want ErrClosed", err)
			}
			if err := l.Close(); err != nil {
				t.Errorf("a second Close = %v, want nil", err)
			}
		})
	}
}
