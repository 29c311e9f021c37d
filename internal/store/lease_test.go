package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLease: a claim takes between Min and Want tokens, or none.
func TestLease(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	peek := func() int64 {
		t.Helper()
		r, err := tb.AllowN(ctx, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining
	}
	steps := []struct {
		claim   Claim
		granted int64
		allowed bool
		left    int64
	}{
		{Claim{Min: 1, Want: 6, Holder: "a", Gen: 1}, 6, true, 4},
		{Claim{Min: 5, Want: 8, Holder: "b", Gen: 1}, 0, false, 4}, // too few: nothing taken
		{Claim{Min: 1, Want: 8, Holder: "c", Gen: 1}, 4, true, 0},
		{Claim{Min: 1, Want: 1, Holder: "d", Gen: 1}, 0, false, 0},
	}
	for i, s := range steps {
		got, r, err := tb.Lease(ctx, "k", s.claim)
		if err != nil {
			t.Fatalf("step %d: Lease(%+v) = %v", i, s.claim, err)
		}
		if got != s.granted || r.Allowed != s.allowed || peek() != s.left {
			t.Errorf("step %d: Lease(%+v) = %d, allowed %v, %d left; want %d, %v, %d left",
				i, s.claim, got, r.Allowed, peek(), s.granted, s.allowed, s.left)
		}
		if !r.Allowed && r.RetryAfter != 100*time.Millisecond {
			t.Errorf("step %d: RetryAfter = %v, want 100ms (one token at 10/s)", i, r.RetryAfter)
		}
	}
}

// TestRefundBatch: refunds of three holders, each of its whole lease
// with some of it spent, in one call.
func TestRefundBatch(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerMinute(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		if n, _, err := tb.Lease(ctx, k, Claim{Min: 10, Want: 10, Holder: "h", Gen: 1}); err != nil || n != 10 {
			t.Fatalf("Lease(%s) = %d, %v; want 10", k, n, err)
		}
	}
	if _, err := tb.Refund(ctx, Refund{Key: "a", N: 1, Holder: "h", Gen: 2, Received: 10},
		Refund{Key: "b", N: 5, Holder: "h", Gen: 2, Received: 10},
		Refund{Key: "c", N: 10, Holder: "h", Gen: 2, Received: 10}); err != nil {
		t.Fatalf("Refund = %v", err)
	}
	for i, want := range []int64{1, 5, 10} {
		r, _ := tb.AllowN(ctx, keys[i], 0)
		if r.Remaining != want {
			t.Errorf("after refund, %s has %d, want %d", keys[i], r.Remaining, want)
		}
	}
}

// TestRefundIdempotent sends a refund with an ID twice, as go-redis does
// when a connection breaks after Redis ran it: it is applied once. Refunds
// without an ID, or with another ID, still add up. The refunds give spent
// tokens back (Refund.Spent, Settle's), which no ledger record bounds.
// On a Cluster the marker key must share the bucket's slot (no CROSSSLOT).
func TestRefundIdempotent(t *testing.T) {
	onEachServer(t, refundIdempotent)
}

func refundIdempotent(t *testing.T, rdb redis.UniversalClient) {
	for _, key := range tagKeys {
		tb, err := New(rdb, TokenBucket, tierlimit.PerHour(100), Config{Hold: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := tb.AllowN(ctx, key, 50); err != nil {
			t.Fatal(err)
		}
		for _, r := range []Refund{
			{Key: key, Spent: 5, ID: "x1", Holder: "h", Gen: 1}, {Key: key, Spent: 5, ID: "x1", Holder: "h", Gen: 1}, // a resend
			{Key: key, Spent: 3, ID: "x2", Holder: "h", Gen: 2},
			{Key: key, Spent: 1, Holder: "h", Gen: 3}, {Key: key, Spent: 1, Holder: "h", Gen: 4},
		} {
			if _, err := tb.Refund(ctx, r); err != nil {
				t.Fatalf("%q: Refund(%+v) = %v", key, r, err)
			}
		}
		if r, _ := tb.AllowN(ctx, key, 0); r.Remaining != 60 {
			t.Errorf("%q: after refunds 5, 5 again, 3, 1, 1: %d tokens, want 60 (the resend not applied)", key, r.Remaining)
		}
		// The markers say which refunds ran, and what each took back of
		// its leased tokens: 4 of a lease of 10, none of spent tokens.
		if got, _, err := tb.Lease(ctx, key, Claim{Min: 1, Want: 10, Holder: "g", Gen: 1}); err != nil || got != 10 {
			t.Fatalf("%q: Lease(10) = %d, %v", key, got, err)
		}
		lease := Refund{Key: key, N: 4, ID: "y1", Holder: "g", Gen: 2, Received: 10}
		if _, err := tb.Refund(ctx, lease); err != nil {
			t.Fatalf("%q: Refund(%+v) = %v", key, lease, err)
		}
		took, err := tb.Applied(ctx, Refund{Key: key, ID: "x1"}, Refund{Key: key, ID: "y1"}, Refund{Key: key, ID: "never"})
		if want := []int64{0, 4, -1}; err != nil || !slices.Equal(took, want) {
			t.Errorf("%q: Applied(x1, y1, never) = %v, %v; want %v", key, took, err, want)
		}
		// The marker lives MarkerTTL (lib.lua's done writes it): hybrid
		// asks about a refund in doubt for that long.
		if ttl, err := rdb.PTTL(ctx, tb.marker(&lease)).Result(); err != nil || ttl <= MarkerTTL-5*time.Second || ttl > MarkerTTL {
			t.Errorf("%q: the marker's TTL = %v, %v; want just under MarkerTTL (%v)", key, ttl, err, MarkerTTL)
		}
		if _, err := tb.Refund(ctx, Refund{Key: key, Spent: 1, ID: strings.Repeat("i", 65), Holder: "h", Gen: 5}); !errors.Is(err, tierlimit.ErrInvalidKey) {
			t.Errorf("Refund with a 65-byte ID = %v, want ErrInvalidKey", err)
		}
		if err := tb.Reset(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoScript flushes the script cache in the middle of a run: callers see
// no error, and pipelined refunds are applied exactly once.
func TestNoScript(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := context.Background()
	var limits []*Limiter
	for _, alg := range Algorithms {
		d, err := New(rdb, alg, tierlimit.PerMinute(1000), Config{})
		if err != nil {
			t.Fatal(err)
		}
		limits = append(limits, d)
	}
	for i := 0; i < 60; i++ {
		if i%20 == 10 {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for j, d := range limits {
			if _, err := d.Allow(ctx, "k"); err != nil {
				t.Fatalf("%s: Allow after SCRIPT FLUSH = %v", Algorithms[j].Name(), err)
			}
		}
	}

	tb, err := New(rdb, TokenBucket, tierlimit.PerHour(100), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.AllowN(ctx, "x", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.AllowN(ctx, "y", 100); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Refund(ctx, Refund{Key: "x", Spent: 7, ID: "r1", Holder: "h", Gen: 1}, Refund{Key: "y", Spent: 9, Holder: "h", Gen: 1}); err != nil {
		t.Fatalf("Refund after SCRIPT FLUSH = %v", err)
	}
	for k, want := range map[string]int64{"x": 7, "y": 9} {
		if r, _ := tb.AllowN(ctx, k, 0); r.Remaining != want {
			t.Errorf("%s has %d after refund, want %d (a refund applied twice or lost)", k, r.Remaining, want)
		}
	}
	redistest.CheckTTLs(t, rdb)
}

func TestLeaseBatch(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerHour(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := tb.AllowN(ctx, "y", 8); err != nil {
		t.Fatal(err)
	}
	grants := tb.LeaseBatch(ctx, []string{"x", "y", "z"},
		[]Claim{{Min: 1, Want: 6, Holder: "a", Gen: 1}, {Min: 3, Want: 5, Holder: "a", Gen: 1}, {Min: 1, Want: 10, Holder: "a", Gen: 1}})
	want := []int64{6, 0, 10}
	for i, g := range grants {
		if g.Err != nil || g.Granted != want[i] || g.Result.Allowed != (want[i] > 0) {
			t.Errorf("grant %d = %+v, want %d granted", i, g, want[i])
		}
	}
	if bad := tb.LeaseBatch(ctx, []string{"x", ""}, []Claim{{Want: 1, Holder: "b", Gen: 1}, {Want: 1, Holder: "b", Gen: 1}}); !errors.Is(bad[0].Err, tierlimit.ErrInvalidKey) {
		t.Errorf("LeaseBatch with an empty key = %v, want ErrInvalidKey for all", bad[0].Err)
	}
}

// TestObserverLeaseCalls checks what the lease primitives report: one call
// per round trip, no decision.
func TestObserverLeaseCalls(t *testing.T) {
	ctx := context.Background()
	var ops []string
	decisions := 0
	obs := &tierlimit.Observer{
		RedisCall: func(c tierlimit.RedisCall) { ops = append(ops, c.Op) },
		Decision:  func(tierlimit.Decision) { decisions++ },
	}
	tb, err := New(miniBackend(t).rdb, TokenBucket, tierlimit.PerHour(10), Config{Hold: time.Second, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.Lease(ctx, "k", Claim{Min: 1, Want: 4, Holder: "h", Gen: 1}); err != nil {
		t.Fatal(err)
	}
	for _, g := range tb.LeaseBatch(ctx, []string{"a", "b"}, []Claim{{Min: 1, Want: 1, Holder: "h", Gen: 1}, {Min: 1, Want: 2, Holder: "h", Gen: 1}}) {
		if g.Err != nil {
			t.Fatal(g.Err)
		}
	}
	if _, err := tb.Refund(ctx, Refund{Key: "k", N: 2, Holder: "h", Gen: 2, Received: 4}, Refund{Key: "a", N: 1, Holder: "h", Gen: 2, Received: 1}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"claim", "claim", "refund"}; !slices.Equal(ops, want) {
		t.Errorf("calls reported %q, want %q", ops, want)
	}
	if decisions != 0 {
		t.Errorf("lease primitives reported %d decisions, want none", decisions)
	}
}

// TestLeaseDebt: a debt claim takes what the bucket holds and puts it in
// debt for the rest, down to minus its capacity; a key in debt is denied,
// with the wait until the level reaches what a call asks, peeks included;
// a claim sent again adds no debt, and a refund repays. On miniredis and a
// real Redis, on small and large limits and with an extra limit.
func TestLeaseDebt(t *testing.T) {
	limits := []struct {
		limit tierlimit.Limit
		extra []tierlimit.Limit
	}{
		{limit: tierlimit.PerSecond(10)},
		{limit: tierlimit.PerDay(1_000_003).WithBurst(10)},
		{limit: tierlimit.PerSecond(1_000_000_000_000).WithBurst(10)},
		{limit: tierlimit.PerSecond(10), extra: []tierlimit.Limit{tierlimit.PerMinute(30).WithBurst(20)}},
	}
	rdb := redistest.Start(t).Client(t)
	for i, tc := range limits {
		t.Run(fmt.Sprint(tc.limit, tc.extra), func(t *testing.T) {
			t.Run("miniredis", func(t *testing.T) {
				b := miniBackend(t)
				b.cfg.Extra = tc.extra
				leaseDebt(t, b, tc.limit)
			})
			t.Run("redis", func(t *testing.T) {
				checkOn(t, rdb, func(t *testing.T, b backend) {
					b.cfg.Extra = tc.extra
					b.cfg.Prefix = fmt.Sprintf("debt%d:", i)
					leaseDebt(t, b, tc.limit)
				})
			})
		})
	}
}

func leaseDebt(t *testing.T, b backend, limit tierlimit.Limit) {
	ctx := context.Background()
	b.set(t0)
	cfg := b.cfg
	cfg.Hold = time.Second
	tb, err := New(b.rdb, TokenBucket, limit, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The one-bucket model of every limit's level, the clock standing
	// still: take is a claim of want (a debt or not), wait the time until
	// every level holds n, in whole µs as the scripts count.
	limits := append([]tierlimit.Limit{limit}, cfg.Extra...)
	levels := make([]int64, len(limits))
	for i, l := range limits {
		levels[i] = l.Capacity()
	}
	take := func(want int64, debt bool) (fresh int64) {
		fresh = want
		for _, v := range levels {
			fresh = min(fresh, v)
		}
		fresh = max(fresh, 0)
		for i, l := range limits {
			levels[i] -= fresh
			if debt {
				levels[i] = max(levels[i]-(want-fresh), -l.Capacity())
			}
		}
		return fresh
	}
	wait := func(n int64) time.Duration {
		var w time.Duration
		for i, l := range limits {
			w = max(w, l.RefillTime(n-levels[i]))
		}
		return (w + time.Microsecond - 1).Truncate(time.Microsecond)
	}
	// The holder "h" spends at once what it is granted (Held 0), and
	// counts what it received, as hybrid does.
	var gen, received int64
	var last Claim
	send := func(c Claim) (int64, tierlimit.Result) {
		t.Helper()
		got, r, err := tb.Lease(ctx, "k", c)
		if err != nil {
			t.Fatalf("Lease(%+v): %v", c, err)
		}
		received += got
		return got, r
	}
	claim := func(c Claim) (int64, tierlimit.Result) {
		t.Helper()
		gen++
		c.Holder, c.Gen, c.Received = "h", gen, received
		last = c
		return send(c)
	}
	denied := func(what string) {
		t.Helper()
		for _, n := range []int64{0, 1, 5} {
			c := Claim{Min: n, Want: n} // a peek for 0
			if n > 0 {
				gen++
				c.Holder, c.Gen = "x", gen // another holder's claim
			}
			got, r, err := tb.Lease(ctx, "k", c)
			if err != nil {
				t.Fatal(err)
			}
			if got != 0 || r.Allowed || r.RetryAfter != wait(n) || r.Remaining != 0 {
				t.Errorf("%s, levels %v: claim of %d = %d, %+v; want denied, RetryAfter %v, Remaining 0",
					what, levels, n, got, r, wait(n))
			}
		}
	}
	capacity := limit.Capacity()
	// 4 taken, then a debt claim of the capacity: what is left, fresh,
	// and the rest below empty.
	if got, _ := claim(Claim{Min: 4, Want: 4}); got != take(4, false) {
		t.Fatalf("claim of 4 granted %d", got)
	}
	want := take(capacity, true)
	if got, r := claim(Claim{Want: capacity, Debt: true}); got != want || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("debt claim of %d = %d, %+v; want %d granted, allowed, Remaining 0", capacity, got, r, want)
	}
	// Sent again (its Gen, as go-redis resends it): it hands what the
	// first reply carried, and takes nothing more.
	if got, _ := send(last); got != want {
		t.Fatalf("the debt claim sent again handed %d, want %d (the first reply's)", got, want)
	}
	received -= want // one of the two replies reached the holder
	denied("in debt")
	// Past the floor: every level stops at minus its capacity.
	for range 3 {
		if got, _ := claim(Claim{Want: capacity, Debt: true}); got != take(capacity, true) {
			t.Fatalf("debt claim granted %d, levels %v", got, levels)
		}
	}
	denied("at the floor")
	// Spent tokens given back repay the debt.
	gen++
	if _, err := tb.Refund(ctx, Refund{Key: "k", Holder: "h", Gen: gen, Received: received, Spent: capacity / 2, ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	for i, l := range limits {
		levels[i] = min(levels[i]+capacity/2, l.Capacity())
	}
	denied("after a give-back")
	// The rate repays the rest: a peek is allowed then, not a µs before.
	b.set(t0.Add(wait(0) - time.Microsecond))
	if _, r, err := tb.Lease(ctx, "k", Claim{}); err != nil || r.Allowed {
		t.Errorf("peek a µs before the debt is repaid = %+v, %v; want denied", r, err)
	}
	b.set(t0.Add(wait(0)))
	if _, r, err := tb.Lease(ctx, "k", Claim{}); err != nil || !r.Allowed {
		t.Errorf("peek once the debt is repaid = %+v, %v; want allowed", r, err)
	}
}
