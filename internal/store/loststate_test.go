package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
)

// TestLedgerLostState: a key Redis no longer has, claimed or refunded by a
// holder whose record should be live (Claim.Live, Refund.Live), lost its
// state: the bucket starts again empty and refills from then on, batched
// or not, with every limit of the key; claimed by a holder without a live
// record, the key is a full bucket, as an idle key that expired is.
func TestLedgerLostState(t *testing.T) {
	onEachServer(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clock := &clocktest.Clock{}
		clock.Set(t0)
		l, err := New(rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: time.Second, Clock: clock, Extra: []tierlimit.Limit{tierlimit.PerMinute(100)}})
		if err != nil {
			t.Fatal(err)
		}
		claim := func(key string, gen int64, live bool) int64 {
			t.Helper()
			got, _, err := l.Lease(ctx, key, Claim{Min: 0, Want: 10, Holder: "h", Gen: gen, Live: live})
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		if got := claim("lost", 1, true); got != 0 {
			t.Errorf("a live holder's claim of a key Redis lost got %d, want 0 (an empty bucket)", got)
		}
		clock.Set(t0.Add(3 * time.Second))
		if got := claim("lost", 2, true); got != 5 {
			t.Errorf("the same holder 3 s later got %d, want 5 (refilled from empty at 100/min, the tighter limit then)", got)
		}
		grants := l.LeaseBatch(ctx, []string{"lost-batch"}, []Claim{{Want: 10, Holder: "h", Gen: 1, Live: true}})
		if g := grants[0]; g.Err != nil || g.Granted != 0 {
			t.Errorf("a live holder's batched claim of a lost key = %+v, want 0 granted", g)
		}
		if failed, err := l.Refund(ctx, Refund{Key: "lost-refund", N: 0, Spent: 3, Holder: "h", Gen: 1, Live: true}); err != nil || len(failed) != 0 {
			t.Fatalf("Refund = %v, %v", failed, err)
		}
		if got := claim("lost-refund", 2, true); got != 3 {
			t.Errorf("a claim after a live holder's refund of 3 spent tokens to a lost key got %d, want 3", got)
		}
		if got := claim("idle", 1, false); got != 10 {
			t.Errorf("a claim without a live record of a key Redis does not have got %d, want 10 (a full bucket)", got)
		}
	})
}

// TestLedgerLateRefundReported: a refund whose holder's record has ended
// (it arrived past the record's deadline) takes none of its leased tokens
// back; Refund reports them in failed, with no error, so that the caller
// counts them lost rather than refunded. A refund in time reports nothing.
func TestLedgerLateRefundReported(t *testing.T) {
	onEachServer(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clock := &clocktest.Clock{}
		clock.Set(t0)
		l, err := New(rdb, TokenBucket, tierlimit.PerHour(100), Config{Hold: time.Second, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct {
			key   string
			after time.Duration
			lost  int64
		}{{"in-time", 500 * time.Millisecond, 0}, {"late", 2 * time.Second, 5}} {
			clock.Set(t0.Add(time.Duration(i) * time.Hour))
			got, _, err := l.Lease(ctx, c.key, Claim{Min: 5, Want: 5, Holder: "h", Gen: 1})
			if err != nil || got != 5 {
				t.Fatalf("Lease = %d, %v; want 5", got, err)
			}
			clock.Set(t0.Add(time.Duration(i)*time.Hour + c.after))
			failed, err := l.Refund(ctx, Refund{Key: c.key, N: 5, Holder: "h", Gen: 2, Received: 5})
			var lost int64
			for _, f := range failed {
				lost += f.N
			}
			if err != nil || lost != c.lost {
				t.Errorf("%s: Refund %v later = %+v, %v; want %d reported not taken back", c.key, c.after, failed, err, c.lost)
			}
		}
	})
}
