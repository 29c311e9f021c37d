package store

import (
	"context"
	"errors"
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
