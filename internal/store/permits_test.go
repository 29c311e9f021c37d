package store

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestSetPermits steps permits.lua through grants, partial grants, forced
// records, give-backs and a call sent twice, on a real Redis.
func TestSetPermits(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	keys := PermitKeys("t:", "k")
	const ttl = time.Minute
	steps := []struct {
		holder            string
		target, n         int64
		force             bool
		wantCount, wantTo int64
	}{
		{"a", 2, 5, false, 2, 2},
		{"a", 2, 5, false, 2, 2}, // the same call again: no change
		{"b", 4, 5, false, 3, 5}, // partial: 3 of 4
		{"c", 1, 5, false, 0, 5}, // full
		{"c", 2, 5, true, 2, 7},  // forced record past N
		{"a", 0, 5, false, 0, 5}, // give back all
		{"c", 3, 5, false, 2, 5}, // over N: no rise
		{"b", 1, 5, false, 1, 3},
		{"c", 4, 5, false, 4, 5},
	}
	for i, s := range steps {
		count, total, err := SetPermits(ctx, rdb, keys, s.holder, s.target, s.n, ttl, s.force)
		if err != nil || count != s.wantCount || total != s.wantTo {
			t.Fatalf("step %d: SetPermits(%s, %d, force %v) = %d, %d, %v; want %d, %d", i, s.holder, s.target, s.force, count, total, err, s.wantCount, s.wantTo)
		}
	}
	for _, k := range keys {
		if d := rdb.PTTL(ctx, k).Val(); d <= 0 || d > ttl+time.Millisecond {
			t.Errorf("PTTL(%s) = %v, want 0 to %v", k, d, ttl)
		}
	}
	rdb.ScriptFlush(ctx) // the pipeline's EVALSHA gets NOSCRIPT, then EVAL
	rs := []Renewal{{Keys: keys, Holders: []string{"a", "b", "c"}}}
	RenewPermits(ctx, rdb, ttl, rs)
	if rs[0].Err != nil || len(rs[0].Counts) != 3 || rs[0].Counts[0] != 0 || rs[0].Counts[1] != 1 || rs[0].Counts[2] != 4 {
		t.Errorf("RenewPermits = %v, %v; want [0 1 4]", rs[0].Counts, rs[0].Err)
	}
	for _, h := range []string{"b", "c"} {
		SetPermits(ctx, rdb, keys, h, 0, 5, ttl, false)
	}
	if n := rdb.Exists(ctx, keys...).Val(); n != 0 {
		t.Errorf("%d keys left with no holder, want 0", n)
	}
}

// TestPermitsExpire: a holder not renewed within its TTL is gone at the
// next call, and its permits with it.
func TestPermitsExpire(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	keys := PermitKeys("t:", "k")
	SetPermits(ctx, rdb, keys, "a", 2, 2, 50*time.Millisecond, false)
	SetPermits(ctx, rdb, keys, "b", 1, 2, time.Minute, false) // full: none
	time.Sleep(60 * time.Millisecond)
	count, total, err := SetPermits(ctx, rdb, keys, "b", 2, 2, time.Minute, false)
	if err != nil || count != 2 || total != 2 {
		t.Errorf("SetPermits after a's TTL = %d, %d, %v; want 2, 2", count, total, err)
	}
	rs := []Renewal{{Keys: keys, Holders: []string{"a"}}}
	RenewPermits(ctx, rdb, time.Minute, rs)
	if rs[0].Err != nil || rs[0].Counts[0] != 0 {
		t.Errorf("renewal of the expired holder = %v, %v; want [0]", rs[0].Counts, rs[0].Err)
	}
}

// TestRenewRecordsLost: a renewal with the holders' counts records again
// the holders a flush lost, past N, and renews the others.
func TestRenewRecordsLost(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	keys := PermitKeys("t:", "k")
	SetPermits(ctx, rdb, keys, "a", 2, 3, time.Minute, false)
	rdb.FlushAll(ctx)
	SetPermits(ctx, rdb, keys, "b", 3, 3, time.Minute, false)
	rs := []Renewal{{Keys: keys, Holders: []string{"a", "b", "c"}, Want: []int64{2, 3, 0}}}
	RenewPermits(ctx, rdb, time.Minute, rs)
	if rs[0].Err != nil || len(rs[0].Counts) != 3 || rs[0].Counts[0] != -2 || rs[0].Counts[1] != 3 || rs[0].Counts[2] != 0 {
		t.Fatalf("RenewPermits = %v, %v; want [-2 3 0]", rs[0].Counts, rs[0].Err)
	}
	if _, total, _ := SetPermits(ctx, rdb, keys, "c", 1, 3, time.Minute, false); total != 5 {
		t.Errorf("total after the lost holder's record = %d, want 5", total)
	}
}
