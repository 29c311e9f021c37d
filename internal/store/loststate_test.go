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

// TestLedgerLostStateRecordedAgain: a key lost while a holder's record was
// live and made again, full, by a caller that could not know (a claim
// without a live record, as another instance's first): the holder's next
// claim records again what it still holds and takes it from the level,
// into debt, so that the fleet's level plus records is back within the
// capacity and what the holder spends is repaid by the refill, not
// admitted on top of a fresh bucket. A live holder that finds the key
// gone starts it empty and records what it holds, taking nothing more.
func TestLedgerLostStateRecordedAgain(t *testing.T) {
	onEachServer(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clock := &clocktest.Clock{}
		clock.Set(t0)
		l, err := New(rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: 3 * time.Second, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		lease := func(key string, c Claim) int64 {
			t.Helper()
			got, _, err := l.Lease(ctx, key, c)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		level := func(key string) (int64, Ledger) {
			t.Helper()
			v, err := rdb.Get(ctx, l.Keys(key)[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			state, led, err := SplitLedger(v)
			if err != nil {
				t.Fatal(err)
			}
			f, err := ParseInts(state, 6)
			if err != nil {
				t.Fatal(err)
			}
			return f[0], led
		}
		for _, key := range []string{"remade", "gone"} {
			if got := lease(key, Claim{Min: 9, Want: 9, Holder: "a", Gen: 1}); got != 9 {
				t.Fatalf("%s: a's lease = %d, want 9", key, got)
			}
		}
		if err := flushAll(ctx, rdb); err != nil {
			t.Fatal(err)
		}
		// Another instance's first claim finds "remade" absent: full.
		if got := lease("remade", Claim{Min: 1, Want: 10, Holder: "b", Gen: 1}); got != 10 {
			t.Fatalf("b's claim of the lost key = %d, want 10 (it cannot know)", got)
		}
		again := Claim{Min: 0, Want: 1, Holder: "a", Gen: 2, Held: 9, Received: 9, Live: true}
		gen, received := int64(1), int64(10) // b's
		if got := lease("remade", again); got != 0 {
			t.Errorf("a's claim after the loss got %d, want 0", got)
		}
		if k, led := level("remade"); k != -9 || len(led.Records) != 2 || led.Total != 19 {
			t.Errorf("remade: level %d, ledger %+v; want -9 (a's 9 taken again), records of b's 10 and a's 9", k, led)
		}
		if got := lease("gone", again); got != 0 {
			t.Errorf("a's claim of the key Redis lost got %d, want 0 (empty)", got)
		}
		if k, led := level("gone"); k != 0 || led.Total != 9 {
			t.Errorf("gone: level %d, ledger %+v; want 0 and a's 9 recorded", k, led)
		}
		// The refill repays the debt before b, which spent its 10, gets
		// anything more. b's record counts its 10 until b's next claim
		// lowers it (the ceiling 10 - 19 holds the level at -9 until
		// then); from there, 1 s at 10/s brings the level to 1.
		for _, c := range []struct {
			at   time.Duration
			want int64
		}{{950 * time.Millisecond, 0}, {1900 * time.Millisecond, 0}, {1950 * time.Millisecond, 1}} {
			clock.Set(t0.Add(c.at))
			gen++
			if got := lease("remade", Claim{Min: 1, Want: 1, Holder: "b", Gen: gen, Received: received}); got != c.want {
				t.Errorf("b's claim %v after the loss got %d, want %d", c.at, got, c.want)
			}
			received += c.want
		}
	})
}
