package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/callcount"
	"github.com/tierlimit/tierlimit/internal/permit"
	"github.com/tierlimit/tierlimit/internal/permit/permittest"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
)

func TestPermits(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.Mini(t)
	c, err := NewConcurrency(rdb, 2, WithPermitFunc(func(k string) int64 {
		if k == "big" {
			return 3
		}
		return tierlimit.DefaultPermits
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tt := range []struct {
		key  string
		want int
	}{{"a", 2}, {"b", 2}, {"big", 3}} {
		var held []tierlimit.Permit
		for {
			p, ok, err := c.TryAcquire(ctx, tt.key)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			held = append(held, p)
		}
		if len(held) != tt.want {
			t.Errorf("TryAcquire(%q) gave %d permits, want %d", tt.key, len(held), tt.want)
		}
		held[0].Release()
		held[0].Release()
		if _, ok, _ := c.TryAcquire(ctx, tt.key); !ok {
			t.Errorf("TryAcquire(%q) after a Release = false, want true", tt.key)
		}
		if _, ok, _ := c.TryAcquire(ctx, tt.key); ok {
			t.Errorf("TryAcquire(%q) after a double Release = true, want false", tt.key)
		}
	}
	keys := store.PermitKeys(DefaultPrefix, "a")
	for _, k := range keys {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > DefaultPermitTTL+time.Millisecond {
			t.Errorf("PTTL(%s) = %v, want 0 to %v", k, ttl, DefaultPermitTTL)
		}
	}
	if s := c.Stats(); s.InUse != 7 || s.Acquired != 10 || s.Refused != 6 {
		t.Errorf("Stats() = %+v, want InUse 7, Acquired 10, Refused 6", s)
	}
}

// TestPermitRoundTrips: one round trip per TryAcquire and per Release.
func TestPermitRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	calls := &callcount.Trips{}
	rdb.AddHook(calls)
	c, _ := NewConcurrency(rdb, 1)
	defer c.Close()
	if p, _, err := c.TryAcquire(ctx, "k"); err == nil { // loads the script
		p.Release()
	}
	for i := range 3 {
		before := calls.Load()
		p, ok, err := c.TryAcquire(ctx, "k")
		if got := calls.Load() - before; !ok || err != nil || got != 1 {
			t.Fatalf("TryAcquire %d = %v, %v with %d round trips, want true, nil with 1", i, ok, err, got)
		}
		before = calls.Load()
		if _, ok, _ := c.TryAcquire(ctx, "k"); ok || calls.Load()-before != 1 {
			t.Errorf("a refused TryAcquire made %d round trips (ok %v), want 1 (false)", calls.Load()-before, ok)
		}
		before = calls.Load()
		p.Release()
		p.Release()
		if got := calls.Load() - before; got != 1 {
			t.Errorf("Release twice made %d round trips, want 1", got)
		}
	}
}

// TestPermitTTL: a permit no one renews (its limiter closed) is free
// within its TTL, and its Release then harms no later holder.
func TestPermitTTL(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	const ttl = 150 * time.Millisecond
	a, _ := NewConcurrency(rdb, 1, WithPermitTTL(ttl))
	b, _ := NewConcurrency(rdb, 1, WithPermitTTL(ttl))
	defer b.Close()
	p, ok, _ := a.TryAcquire(ctx, "k")
	if !ok {
		t.Fatal("TryAcquire = false, want true")
	}
	time.Sleep(ttl) // renewed meanwhile: still held
	if _, ok, _ := b.TryAcquire(ctx, "k"); ok {
		t.Fatalf("TryAcquire of a renewed permit's key = true, want false")
	}
	a.Close()
	start := time.Now()
	q, err := b.Acquire(ctx, "k")
	if err != nil || time.Since(start) > ttl+ttl/3+100*time.Millisecond {
		t.Fatalf("Acquire after the holder's Close = %v after %v, want a permit within %v", err, time.Since(start), ttl+ttl/3)
	}
	p.Release() // after its TTL and its limiter's Close: harmless
	if _, ok, _ := b.TryAcquire(ctx, "k"); ok {
		t.Errorf("TryAcquire after a stale Release = true, want false: it freed the new holder's permit")
	}
	q.Release()
	time.Sleep(10 * time.Millisecond)
	if n := rdb.Exists(ctx, store.PermitKeys(DefaultPrefix, "k")...).Val(); n != 0 {
		t.Errorf("%d permit keys left after every permit's release, want 0", n)
	}
}

func TestPermitInput(t *testing.T) {
	_, rdb := redistest.Mini(t)
	for _, tt := range []struct {
		rdb  redis.UniversalClient
		n    int64
		opts []ConcurrencyOption
		want error
	}{
		{rdb, 0, nil, tierlimit.ErrInvalidLimit},
		{rdb, tierlimit.MaxPermits + 1, nil, tierlimit.ErrInvalidLimit},
		{nil, 1, nil, tierlimit.ErrInvalidOption},
		{rdb, 1, []ConcurrencyOption{nil}, tierlimit.ErrInvalidOption},
		{rdb, 1, []ConcurrencyOption{WithPermitFunc(nil)}, tierlimit.ErrInvalidOption},
		{rdb, 1, []ConcurrencyOption{WithPermitTTL(time.Millisecond)}, tierlimit.ErrInvalidOption},
		{rdb, 1, []ConcurrencyOption{WithPermitTTL(2 * time.Hour)}, tierlimit.ErrInvalidOption},
		{rdb, 1, []ConcurrencyOption{WithPermitPrefix("a{b")}, tierlimit.ErrInvalidOption},
	} {
		if c, err := NewConcurrency(tt.rdb, tt.n, tt.opts...); !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "remote: ") {
			t.Errorf("NewConcurrency(%d, ...) = %v, want remote: %v", tt.n, err, tt.want)
			if c != nil {
				c.Close()
			}
		}
	}
	c, _ := NewConcurrency(rdb, 1, WithPermitFunc(func(k string) int64 { return map[string]int64{"neg": -2, "huge": 1 << 40}[k] }))
	permittest.InvalidKeys(t, c)
	permittest.PastDeadlineClose(t, c)
}

// TestPermitWake: a Release in this process wakes a waiter at once,
// not at its next poll.
func TestPermitWake(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	c, _ := NewConcurrency(rdb, 1)
	defer c.Close()
	p, _, _ := c.TryAcquire(ctx, "k")
	got := make(chan time.Time)
	go func() {
		q, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Error(err)
		} else {
			q.Release()
		}
		got <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond) // the waiter's poll reaches its bound
	released := time.Now()
	p.Release()
	if d := (<-got).Sub(released); d > permit.PollMax/2 {
		t.Errorf("waiter admitted %v after the Release, want under %v", d, permit.PollMax/2)
	}
}

// TestPermitCloseRace: Close racing every call never panics or
// blocks, and leaves no goroutine behind.
func TestPermitCloseRace(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	permittest.CloseRace(t, func() permittest.Limiter {
		c, _ := NewConcurrency(rdb, 2, WithPermitTTL(MinPermitTTL))
		return c
	}, false)
}

// The fleet: members are this test binary run again as OS processes
// (TestPermitMember), each with 32 goroutines holding permits of one
// key for 1-50 ms, each checking a counter in Redis the test owns.

// permitTier makes remote's limiters for permittest's fleet.
var permitTier = permittest.Tier{
	New: func(rdb *redis.Client, n int64, ttl time.Duration) (permittest.Limiter, error) {
		opts := []ConcurrencyOption{}
		if ttl != 0 {
			opts = append(opts, WithPermitTTL(ttl))
		}
		return NewConcurrency(rdb, n, opts...)
	},
}

func TestPermitMember(t *testing.T) { permittest.Member(t, permitTier) }

func TestPermitFleet(t *testing.T) { permittest.Fleet(t) }

// TestPermitKilledHolder: a SIGKILLed holder's permits are free within
// TTL plus one renewal interval.
func TestPermitKilledHolder(t *testing.T) { permittest.KilledHolder(t, permitTier) }

// TestPermitCluster: on a Redis Cluster, keys of any bytes take permits
// (one key's state on one slot), and renewals, one pipeline over every
// node, keep them past their TTL.
func TestPermitCluster(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.StartCluster(t).Client(t)
	// Renewals every TTL/3 must keep the permits through a busy machine
	// (CI under -race): at 90 ms, every renewal of one tick came too late.
	const ttl = 600 * time.Millisecond
	a, err := NewConcurrency(rdb, 1, WithPermitTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _ := NewConcurrency(rdb, 1, WithPermitTTL(ttl))
	defer b.Close()
	keys := []string{"a", "{b}", "c}{", "d:e", "\xff\x00", "f", "g", "h"}
	for _, k := range keys {
		if _, ok, err := a.TryAcquire(ctx, k); !ok || err != nil {
			t.Fatalf("TryAcquire(%q) = %v, %v; want true, nil", k, ok, err)
		}
	}
	time.Sleep(3 * ttl)
	for _, k := range keys {
		if _, ok, err := b.TryAcquire(ctx, k); ok || err != nil {
			t.Errorf("TryAcquire(%q) of a renewed permit = %v, %v; want false, nil", k, ok, err)
		}
	}
	if s := a.Stats(); s.Expired != 0 {
		t.Errorf("Stats().Expired = %d, want 0: renewals kept every permit", s.Expired)
	}
}

// TestPermitMisconfigured: a Redis that refuses the script is an error
// wrapping ErrMisconfigured.
func TestPermitMisconfigured(t *testing.T) {
	ctx := context.Background()
	admin := redistest.Start(t).Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "noeval", "on", "nopass", "~*", "+@all", "-evalsha", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "noeval", Password: "any"})
	defer rdb.Close()
	c, _ := NewConcurrency(rdb, 2)
	defer c.Close()
	if _, ok, err := c.TryAcquire(ctx, "k"); ok || !errors.Is(err, tierlimit.ErrMisconfigured) || !strings.HasPrefix(err.Error(), "remote: ") {
		t.Errorf("TryAcquire = %v, %v; want false, remote: ErrMisconfigured", ok, err)
	}
	if p, err := c.Acquire(ctx, "k"); p.Valid() || !errors.Is(err, tierlimit.ErrMisconfigured) {
		t.Errorf("Acquire = %v, %v; want nil, ErrMisconfigured", p, err)
	}
}

// BenchmarkPermit is TryAcquire and Release on one key, and reports the
// Redis round trips each pair made.
func BenchmarkPermit(b *testing.B) {
	ctx := context.Background()
	rdb := redistest.Start(b).Client(b)
	calls := &callcount.Trips{}
	rdb.AddHook(calls)
	c, _ := NewConcurrency(rdb, 1<<20)
	defer c.Close()
	b.ReportAllocs()
	before := calls.Load()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, ok, err := c.TryAcquire(ctx, "k")
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			p.Release()
		}
	})
	b.ReportMetric(float64(calls.Load()-before)/float64(b.N), "calls/op")
}

func TestPermitObserver(t *testing.T) {
	var mu sync.Mutex
	var got []tierlimit.PermitDecision
	o := &tierlimit.Observer{Permit: func(d tierlimit.PermitDecision) { mu.Lock(); got = append(got, d); mu.Unlock() }}
	_, rdb := redistest.Mini(t)
	c, _ := NewConcurrency(rdb, 1, WithPermitObserver(o))
	defer c.Close()
	ctx := context.Background()
	c.TryAcquire(ctx, "k")
	c.TryAcquire(ctx, "k")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	c.Acquire(short, "k")
	want := []bool{true, false, false}
	if len(got) != len(want) {
		t.Fatalf("observer got %d decisions, want %d", len(got), len(want))
	}
	for i, d := range got {
		if d.Acquired != want[i] || d.Source != tierlimit.SourceRemote || (d.Waited > 0) != (i == 2) {
			t.Errorf("decision %d = %+v, want Acquired %v, SourceRemote", i, d, want[i])
		}
	}
}

// TestPermitRenewalRoundTrips: a renewal tick renews every permit held,
// over many keys, in one round trip.
func TestPermitRenewalRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	calls := &callcount.Trips{}
	rdb.AddHook(calls)
	const ttl = 300 * time.Millisecond // a tick every 100 ms
	c, _ := NewConcurrency(rdb, 3, WithPermitTTL(ttl))
	defer c.Close()
	for i := range 20 {
		for range 2 {
			if _, ok, err := c.TryAcquire(ctx, fmt.Sprint("k", i)); !ok || err != nil {
				t.Fatalf("TryAcquire = %v, %v", ok, err)
			}
		}
	}
	before := calls.Load()
	time.Sleep(5 * ttl / 3) // 5 ticks
	got := calls.Load() - before
	if got < 4 || got > 6 {
		t.Errorf("%d round trips over 5 renewal ticks of 40 permits on 20 keys, want 4 to 6 (one per tick)", got)
	}
	if s := c.Stats(); s.Expired != 0 {
		t.Errorf("Stats().Expired = %d, want 0", s.Expired)
	}
}

// TestPermitBurst: simultaneous arrivals on a key with permits free get
// them, cold and warm.
func TestPermitBurst(t *testing.T) {
	c, _ := NewConcurrency(redistest.Start(t).Client(t), 3)
	defer c.Close()
	permittest.Burst(t, c)
}

// TestPermitCloseStalled: Close is bounded on a paused Redis with go-redis's
// default client.
func TestPermitCloseStalled(t *testing.T) {
	srv := redistest.Start(t)
	permittest.CloseStalled(t, srv.Addr, func(rdb *redis.Client) permittest.Limiter {
		c, _ := NewConcurrency(rdb, 5)
		return c
	})
}

// TestPermitFaults runs the fault table (permittest.FaultTable).
func TestPermitFaults(t *testing.T) { permittest.FaultTable(t) }

// TestPermitNoPermits: a key its permit func blocks is refused, without a
// call to Redis.
func TestPermitNoPermits(t *testing.T) {
	c, _ := NewConcurrency(redistest.Start(t).Client(t), 2, WithPermitFunc(func(k string) int64 {
		if k == "none" {
			return tierlimit.NoPermits
		}
		return tierlimit.DefaultPermits
	}))
	defer c.Close()
	permittest.Blocked(t, c)
}
