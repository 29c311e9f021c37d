package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestLeasePerKeyLimit leases under Claim.Limit: a key drained under one
// limit and claimed under another keeps its state (no fresh bucket), and a
// Refund caps at its own limit's capacity.
func TestLeasePerKeyLimit(t *testing.T) {
	ctx := context.Background()
	free, pro := tierlimit.PerSecond(10), tierlimit.PerSecond(100)
	b := miniBackend(t)
	b.set(t0)
	tb, err := New(b.rdb, TokenBucket, free, Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var gen, received int64
	claim := func(c Claim) (int64, tierlimit.Result) {
		t.Helper()
		gen++ // a claim numbered as the last is that claim sent again
		c.Holder, c.Gen, c.Received = "a", gen, received
		n, res, err := tb.Lease(ctx, "k", c)
		if err != nil {
			t.Fatalf("Lease(%+v) = %v", c, err)
		}
		received += n
		return n, res
	}
	if n, _ := claim(Claim{Min: 10, Want: 10}); n != 10 {
		t.Fatalf("Lease(10) at the default = %d, want 10", n)
	}
	// The plan changes to pro: still drained, then pro's rate.
	if n, res := claim(Claim{Min: 1, Want: 50, Limit: pro}); n != 0 || res.Limit != pro {
		t.Errorf("Lease under pro right after = %d (limit %v), want 0 (no fresh bucket) under %v", n, res.Limit, pro)
	}
	b.set(t0.Add(100 * time.Millisecond))
	if n, _ := claim(Claim{Min: 1, Want: 50, Limit: pro}); n != 10 {
		t.Errorf("Lease under pro 100 ms later = %d, want 10 (pro's rate)", n)
	}
	// Spent tokens given back under free (its record ended by the
	// refund): up to free's capacity.
	gen++
	if _, err := tb.Refund(ctx, Refund{Key: "k", Spent: 10, Limit: free, Holder: "a", Gen: gen, Received: received}); err != nil {
		t.Fatal(err)
	}
	if r, _ := tb.AllowN(ctx, "k", 0); r.Remaining != 10 {
		t.Errorf("after a refund of 10 under free: %d left, want 10 (free's capacity)", r.Remaining)
	}
	if _, err := tb.Refund(ctx, Refund{Key: "k", Spent: 11, Limit: free, Holder: "a", Gen: gen + 1}); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("Refund of 11 under a capacity of 10 = nil error, want ErrInvalidCost")
	}
	if _, _, err := tb.Lease(ctx, "k", Claim{Want: 1, Limit: tierlimit.Limit{Rate: 1}, Holder: "a", Gen: gen + 1}); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("Lease under a bad limit = nil error, want ErrInvalidLimit")
	}
}

// TestLeaseBatchPerKeyLimit claims for keys of different limits in one
// batch: each is granted up to its own limit's capacity.
func TestLeaseBatchPerKeyLimit(t *testing.T) {
	b := miniBackend(t)
	b.set(t0)
	tb, err := New(b.rdb, TokenBucket, tierlimit.PerSecond(10), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	grants := tb.LeaseBatch(context.Background(), []string{"free", "pro"}, []Claim{
		{Min: 1, Want: 10, Holder: "a", Gen: 1}, {Min: 1, Want: 50, Limit: tierlimit.PerSecond(100), Holder: "a", Gen: 1},
	})
	for i, want := range []int64{10, 50} {
		if grants[i].Err != nil || grants[i].Granted != want {
			t.Errorf("grant %d = %+v, want %d granted", i, grants[i], want)
		}
	}
	// A Want above the claim's own limit's capacity fails the batch.
	bad := tb.LeaseBatch(context.Background(), []string{"free"}, []Claim{{Min: 1, Want: 50, Holder: "a", Gen: 2}})
	if !errors.Is(bad[0].Err, tierlimit.ErrInvalidCost) {
		t.Errorf("LeaseBatch of 50 under a capacity of 10 = %v, want ErrInvalidCost", bad[0].Err)
	}
}

// TestSlot checks slotOf against the Cluster's CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	c := redistest.StartCluster(t).Client(t)
	ctx := context.Background()
	for i, key := range append(tagKeys, "", "a", "123456789") {
		tag := keyTag(key)
		want, err := c.ClusterKeySlot(ctx, "x{"+string(tag[:])+"}y").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slotOf(string(tag[:])); int64(got) != want {
			t.Errorf("key %d: slotOf = %d, CLUSTER KEYSLOT = %d", i, got, want)
		}
	}
	if got := slotOf("123456789"); got != 0x31C3&16383 {
		t.Errorf("slotOf(123456789) = %d, want %d (CRC16/XMODEM check value)", got, 0x31C3&16383)
	}
}

// TestAllowAllClusterUndo runs AllowAll on a 3-master Cluster over keys in
// two slots, the later one drained: the earlier slot's charge is given back
// before AllowAll returns, for every algorithm.
func TestAllowAllClusterUndo(t *testing.T) {
	rdb := redistest.StartCluster(t).Client(t)
	ctx := context.Background()
	first, second := keysInOrder(t)
	for _, alg := range Algorithms {
		t.Run(alg.Name(), func(t *testing.T) {
			l, err := New(rdb, alg, tierlimit.PerMinute(10), Config{Prefix: "undo:"})
			if err != nil {
				t.Fatal(err)
			}
			if !l.cluster {
				t.Fatal("a *redis.ClusterClient was not seen as a Cluster")
			}
			if r, err := l.AllowN(ctx, second, 10); err != nil || !r.Allowed {
				t.Fatalf("AllowN(%s, 10) = %+v, %v", second, r, err)
			}
			r, err := l.AllowAll(ctx, tierlimit.Take{Key: second, N: 1}, tierlimit.Take{Key: first, N: 4})
			if err != nil || r.Allowed {
				t.Fatalf("AllowAll with %s drained = %+v, %v; want denied", second, r, err)
			}
			if r, _ := l.AllowN(ctx, first, 0); r.Remaining != 10 {
				t.Errorf("%s after the refused AllowAll: %d left, want 10 (its charge given back)", first, r.Remaining)
			}
			r, err = l.AllowAll(ctx, tierlimit.Take{Key: first, N: 4}, tierlimit.Take{Key: second, N: 0})
			if err != nil || !r.Allowed || r.Remaining != 0 {
				t.Errorf("AllowAll(%s 4, %s 0) = %+v, %v; want allowed, 0 left", first, second, r, err)
			}
			for _, k := range []string{first, second} {
				if err := l.Reset(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	redistest.CheckTTLs(t, rdb)
}

// keysInOrder returns two user keys whose slots are in that order.
func keysInOrder(t *testing.T) (string, string) {
	t.Helper()
	var prev string
	for i := range 100 {
		k := fmt.Sprint("key", i)
		if prev == "" {
			prev = k
			continue
		}
		a, b := keyTag(prev), keyTag(k)
		sa, sb := slotOf(string(a[:])), slotOf(string(b[:]))
		switch {
		case sa < sb:
			return prev, k
		case sb < sa:
			return k, prev
		}
	}
	t.Fatal("no two keys in different slots")
	return "", ""
}

// TestAllowAllLedger: a Limiter with a lease ledger decides one key at a
// time.
func TestAllowAllLedger(t *testing.T) {
	tb, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), TokenBucket, tierlimit.PerSecond(1), Config{Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.AllowAll(context.Background(), tierlimit.Take{Key: "a", N: 1}); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Error("AllowAll with a ledger = nil error")
	}
	if _, err := tb.Settle(context.Background(), "a", 1, 0); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Error("Settle with a ledger = nil error")
	}
}
