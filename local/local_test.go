package local

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/front"
)

func newTest(t *testing.T, limit tierlimit.Limit, opts ...Option) (*Limiter, *clocktest.Clock) {
	t.Helper()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	l, err := New(limit, append([]Option{WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clock
}

func TestSequence(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(4))
	ctx := context.Background()
	steps := []struct {
		advance   time.Duration
		n         int64
		allowed   bool
		remaining int64
		retry     time.Duration
	}{
		{0, 0, true, 4, 0},
		{0, 3, true, 1, 0},
		{0, 2, false, 1, 250 * time.Millisecond},
		{0, 1, true, 0, 0},
		{100 * time.Millisecond, 1, false, 0, 150 * time.Millisecond},
		{150 * time.Millisecond, 1, true, 0, 0},
		{time.Second, 4, true, 0, 0},
	}
	for i, s := range steps {
		clock.Add(s.advance)
		r, err := l.AllowN(ctx, "k", s.n)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry || r.Source != tierlimit.SourceLocal {
			t.Errorf("step %d: AllowN(%d) = %v %d %v %v, want %v %d %v local",
				i, s.n, r.Allowed, r.Remaining, r.RetryAfter, r.Source, s.allowed, s.remaining, s.retry)
		}
	}
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if r, _ := l.AllowN(ctx, "k", 4); !r.Allowed {
		t.Errorf("after Reset: AllowN(4) = false, want true")
	}
}

func TestKeysAreIndependent(t *testing.T) {
	l, _ := newTest(t, tierlimit.PerMinute(2))
	ctx := context.Background()
	for _, k := range []string{"a", "b", "\xff{"} {
		for i := 0; i < 3; i++ {
			r, _ := l.Allow(ctx, k)
			if want := i < 2; r.Allowed != want {
				t.Errorf("%q call %d: Allowed = %v, want %v", k, i, r.Allowed, want)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	if _, err := New(tierlimit.Limit{}); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("New(zero limit) = %v, want ErrInvalidLimit", err)
	}
	if _, err := New(tierlimit.PerSecond(1).WithBurst(1 << 52)); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("New(overflowing burst) = %v, want ErrInvalidLimit", err)
	}
	for _, o := range []Option{WithMaxKeys(0), WithMaxKeys(-1), WithClock(nil), nil} {
		if _, err := New(tierlimit.PerSecond(1), o); !errors.Is(err, tierlimit.ErrInvalidOption) {
			t.Errorf("New(bad option) = %v, want ErrInvalidOption", err)
		}
	}
	// The input rules of the calls, which every tier shares, are
	// TestInputRules's, at the module's root.
}

// TestConcurrentFirstCalls checks that callers racing on a new key share
// one bucket: exactly the burst is admitted.
func TestConcurrentFirstCalls(t *testing.T) {
	l, _ := newTest(t, tierlimit.PerHour(50))
	for round := 0; round < 20; round++ {
		key := fmt.Sprint("k", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := 0
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					if r, _ := l.Allow(context.Background(), key); r.Allowed {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if admitted != 50 {
			t.Fatalf("round %d: admitted %d, want 50", round, admitted)
		}
	}
}

// TestMemoryBounded sends many distinct keys through a small limiter: the
// cache holds at most MaxKeys of them.
func TestMemoryBounded(t *testing.T) {
	l, _ := newTest(t, tierlimit.PerSecond(10), WithMaxKeys(1000))
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < 200_000; i++ {
		l.Allow(ctx, fmt.Sprint("key-", i))
	}
	l.cache.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := l.cache.Metrics.KeysAdded() - l.cache.Metrics.KeysEvicted(); n > 1000 {
		t.Errorf("cache holds %d keys, want <= 1000", n)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 4<<20 {
		t.Errorf("heap grew %d bytes for 1000 keys, want < 4 MiB", grew)
	}
}

// TestHotKeysOutliveAScan checks that the front table reports its hits to
// ristretto's admission policy: keys decided often, from the front table,
// keep their buckets (drained, so a bucket made again would be full and
// allow) while 20 times the cache's size of keys asked once each pass
// through it. Without the sampled uses ristretto's sketch sees a hot key
// only when the front table misses, and evicts it for one-shot keys.
func TestHotKeysOutliveAScan(t *testing.T) {
	if raceEnabled {
		// ristretto counts Gets through buffers kept in a sync.Pool,
		// which the race detector empties at random: the sketch then
		// misses most uses, of every key.
		t.Skip("ristretto's use counts are lossy under the race detector")
	}
	const maxKeys, hot = 1000, 50
	l, _ := newTest(t, tierlimit.PerHour(5), WithMaxKeys(maxKeys))
	ctx := context.Background()
	hotKey := func(i int) string { return fmt.Sprint("hot-", i%hot) }
	for i := range 5 * hot {
		if r, err := l.Allow(ctx, hotKey(i)); err != nil || !r.Allowed {
			t.Fatalf("Allow(%q) while draining = %+v, %v, want allowed", hotKey(i), r, err)
		}
	}
	// Hot before the scan begins: ristretto's sketch counts up to 15 uses.
	for i := range 16 * front.SampleEvery * hot {
		l.Allow(ctx, hotKey(i))
	}
	for i := range 20 * maxKeys {
		l.Allow(ctx, fmt.Sprint("once-", i))
		for j := range 4 {
			if r, err := l.Allow(ctx, hotKey(4*i+j)); err != nil || r.Allowed {
				t.Fatalf("after %d one-shot keys: Allow(%q) = %+v, %v, want denied (its drained bucket evicted)",
					i, hotKey(4*i+j), r, err)
			}
		}
	}
}

// TestEntryLayout checks entry's two cache lines (see entry): what a
// decision only reads within the first 64 bytes, what it writes in the
// second, the whole in Go's 128-byte size class.
func TestEntryLayout(t *testing.T) {
	et := reflect.TypeFor[entry]()
	// Go's allocator puts objects of 113 to 128 bytes at multiples of 128
	// in their span, so that each starts on a cache line; the 112-byte
	// class below does not.
	if size := et.Size(); size <= 112 || size > 128 {
		t.Errorf("entry is %d bytes, want 113 to 128 (Go's 128-byte size class)", size)
	}
	bf, _ := et.FieldByName("b")
	field := func(name string) (offset, size uintptr) {
		if f, ok := et.FieldByName(name); ok {
			return f.Offset, f.Type.Size()
		}
		f, ok := bf.Type.FieldByName(name)
		if !ok {
			t.Fatalf("entry and its bucket have no field %s", name)
		}
		return bf.Offset + f.Offset, f.Type.Size()
	}
	for _, name := range []string{"key", "gone", "limit", "unit", "per"} {
		if off, size := field(name); off+size > 64 {
			t.Errorf("%s, read by every decision, at bytes %d to %d: want it in the first 64", name, off, off+size)
		}
	}
	for _, name := range []string{"mu", "tokens", "owed", "rem", "last"} {
		if off, _ := field(name); off < 64 {
			t.Errorf("%s, written by every decision, at byte %d: want it past the first 64", name, off)
		}
	}
}

func ExampleLimiter() {
	l, _ := New(tierlimit.PerSecond(2))
	defer l.Close()
	for i := 0; i < 3; i++ {
		r, _ := l.Allow(context.Background(), "client-1")
		fmt.Println(r.Allowed)
	}
	// Output:
	// true
	// true
	// false
}

func TestSetLimit(t *testing.T) {
	l, clock := newTest(t, tierlimit.PerSecond(10))
	ctx := context.Background()
	if r, _ := l.AllowN(ctx, "old", 6); !r.Allowed {
		t.Fatal("AllowN(old, 6) = false, want true")
	}
	if err := l.SetLimit(tierlimit.PerSecond(2)); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Limit(), tierlimit.PerSecond(2); got != want {
		t.Errorf("Limit() = %v, want %v", got, want)
	}
	// A key held before keeps its 4 tokens, capped at the new burst of 2.
	if r, _ := l.AllowN(ctx, "old", 2); !r.Allowed || r.Limit != tierlimit.PerSecond(2) {
		t.Errorf("old key: AllowN(2) = %v under %v, want true under 2/s", r.Allowed, r.Limit)
	}
	if r, _ := l.AllowN(ctx, "old", 1); r.Allowed || r.RetryAfter != 500*time.Millisecond {
		t.Errorf("old key: AllowN(1) = %v, retry %v, want false, 500ms", r.Allowed, r.RetryAfter)
	}
	// A new key starts with the new burst.
	if r, _ := l.AllowN(ctx, "new", 2); !r.Allowed || r.Remaining != 0 {
		t.Errorf("new key: AllowN(2) = %v, remaining %d, want true, 0", r.Allowed, r.Remaining)
	}
	clock.Add(500 * time.Millisecond)
	if r, _ := l.AllowN(ctx, "new", 1); !r.Allowed {
		t.Error("new key 500ms later: AllowN(1) = false, want true at 2/s")
	}
	if _, err := l.AllowN(ctx, "new", 3); !errors.Is(err, tierlimit.ErrInvalidCost) {
		t.Errorf("AllowN(3) above the new burst: err = %v, want ErrInvalidCost", err)
	}
	if err := l.SetLimit(tierlimit.Limit{}); !errors.Is(err, tierlimit.ErrInvalidLimit) {
		t.Errorf("SetLimit(zero) = %v, want ErrInvalidLimit", err)
	}
	if got, want := l.Limit(), tierlimit.PerSecond(2); got != want {
		t.Errorf("after a rejected SetLimit: Limit() = %v, want %v", got, want)
	}
}
