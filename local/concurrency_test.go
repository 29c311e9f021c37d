package local

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/permit/permittest"
)

func TestPermitLimit(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		n    int64
		fn   tierlimit.PermitFunc
		key  string
		want int // permits TryAcquire gives before the first refusal
	}{
		{"one", 1, nil, "a", 1},
		{"three", 3, nil, "a", 3},
		{"func", 3, func(k string) int64 { return int64(len(k)) }, "abcde", 5},
		{"func default", 3, func(string) int64 { return tierlimit.DefaultPermits }, "abcde", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []ConcurrencyOption
			if tt.fn != nil {
				opts = append(opts, WithPermitFunc(tt.fn))
			}
			c, err := NewConcurrency(tt.n, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var held []tierlimit.Permit
			for i := 0; ; i++ {
				p, ok, err := c.TryAcquire(ctx, tt.key)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					if i != tt.want {
						t.Fatalf("TryAcquire gave %d permits, want %d", i, tt.want)
					}
					break
				}
				held = append(held, p)
			}
			if _, ok, _ := c.TryAcquire(ctx, "other"); !ok {
				t.Errorf("TryAcquire(other) = false, want true: keys are independent")
			}
			held[0].Release()
			held[0].Release() // twice: harmless
			if _, ok, _ := c.TryAcquire(ctx, tt.key); !ok {
				t.Errorf("TryAcquire after a Release = false, want true")
			}
			if _, ok, _ := c.TryAcquire(ctx, tt.key); ok {
				t.Errorf("TryAcquire after a double Release = true, want false: it freed two")
			}
			if s := c.Stats(); s.InUse != int64(tt.want+1) || s.Refused != 2 {
				t.Errorf("Stats() = %+v, want InUse %d, Refused 2", s, tt.want+1)
			}
		})
	}
}

// TestPermitFIFO: a released permit goes to the longest waiter, and a
// TryAcquire cannot take it past waiters.
func TestPermitFIFO(t *testing.T) {
	ctx := context.Background()
	c, _ := NewConcurrency(1)
	p, _, _ := c.TryAcquire(ctx, "k")
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, err := c.Acquire(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			q.Release()
		}()
		waitFor(t, func() bool { return c.Stats().Waiting == int64(i+1) })
	}
	if _, ok, _ := c.TryAcquire(ctx, "k"); ok {
		t.Errorf("TryAcquire with waiters = true, want false")
	}
	p.Release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Errorf("waiter %d served, want %d", got, want)
		}
		want++
	}
	if n := c.keysHeld(); n != 0 {
		t.Errorf("%d keys kept with nothing out, want 0", n)
	}
}

func (c *Concurrency) keysHeld() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].keys)
		c.shards[i].mu.Unlock()
	}
	return n
}

// TestPermitWaitEnds: Acquire fails at once for a ctx already done or
// past its deadline, gives up when ctx ends while waiting, and returns
// ErrClosed when Close runs while it waits.
func TestPermitWaitEnds(t *testing.T) {
	c, _ := NewConcurrency(1)
	p, _, _ := c.TryAcquire(context.Background(), "k")
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	soon, cancel3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel3()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		want error
		max  time.Duration
	}{
		{"past deadline", past, context.DeadlineExceeded, 5 * time.Millisecond},
		{"cancelled", done, context.Canceled, 5 * time.Millisecond},
		{"deadline while waiting", soon, context.DeadlineExceeded, time.Second},
	} {
		start := time.Now()
		_, err := c.Acquire(tt.ctx, "k")
		if !errors.Is(err, tt.want) || time.Since(start) > tt.max {
			t.Errorf("%s: Acquire = %v after %v, want %v within %v", tt.name, err, time.Since(start), tt.want, tt.max)
		}
	}
	errc := make(chan error)
	go func() {
		_, err := c.Acquire(context.Background(), "k")
		errc <- err
	}()
	waitFor(t, func() bool { return c.Stats().Waiting == 1 })
	c.Close()
	if err := <-errc; !errors.Is(err, tierlimit.ErrClosed) {
		t.Errorf("Acquire waiting across Close = %v, want ErrClosed", err)
	}
	p.Release() // after Close: harmless
	p.Release()
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

func TestPermitInput(t *testing.T) {
	for _, tt := range []struct {
		n    int64
		opts []ConcurrencyOption
		want error
	}{
		{0, nil, tierlimit.ErrInvalidLimit},
		{-1, nil, tierlimit.ErrInvalidLimit},
		{tierlimit.MaxPermits + 1, nil, tierlimit.ErrInvalidLimit},
		{1, []ConcurrencyOption{WithPermitFunc(nil)}, tierlimit.ErrInvalidOption},
		{1, []ConcurrencyOption{nil}, tierlimit.ErrInvalidOption},
	} {
		if _, err := NewConcurrency(tt.n, tt.opts...); !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "local: ") {
			t.Errorf("NewConcurrency(%d, ...) = %v, want local: %v", tt.n, err, tt.want)
		}
	}
	c, _ := NewConcurrency(2, WithPermitFunc(func(k string) int64 {
		if k == "neg" {
			return -2
		}
		if k == "huge" {
			return tierlimit.MaxPermits + 1
		}
		return tierlimit.DefaultPermits
	}))
	permittest.InvalidKeys(t, c)
	c.Close()
	permittest.Closed(t, c)
}

// TestPermitExact: many goroutines never hold more than n permits of
// a key.
func TestPermitExact(t *testing.T) {
	const n = 3
	c, _ := NewConcurrency(n)
	var mu sync.Mutex
	in, peak := 0, 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				p, err := c.Acquire(ctx, "k")
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				in++
				peak = max(peak, in)
				mu.Unlock()
				mu.Lock()
				in--
				mu.Unlock()
				p.Release()
			}
		}()
	}
	wg.Wait()
	if peak > n || peak == 0 {
		t.Errorf("peak in flight = %d, want 1 to %d", peak, n)
	}
	if k := c.keysHeld(); k != 0 {
		t.Errorf("%d keys kept after all released, want 0", k)
	}
}

// BenchmarkPermit is a warm TryAcquire and Release on one key per
// goroutine.
func BenchmarkPermit(b *testing.B) {
	c, _ := NewConcurrency(1 << 20)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, ok, err := c.TryAcquire(ctx, "bench")
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			p.Release()
		}
	})
}

func TestPermitShardSize(t *testing.T) {
	if got := unsafe.Sizeof(concShard{}); got != 128 {
		t.Errorf("unsafe.Sizeof(concShard{}) = %d, want 128 (two cache lines)", got)
	}
}

func TestPermitObserver(t *testing.T) {
	var mu sync.Mutex
	var got []tierlimit.PermitDecision
	o := &tierlimit.Observer{Permit: func(d tierlimit.PermitDecision) { mu.Lock(); got = append(got, d); mu.Unlock() }}
	c, _ := NewConcurrency(1, WithPermitObserver(o))
	ctx := context.Background()
	p, _, _ := c.TryAcquire(ctx, "k")
	c.TryAcquire(ctx, "k")
	go func() { time.Sleep(20 * time.Millisecond); p.Release() }()
	q, _ := c.Acquire(ctx, "k")
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	c.Acquire(short, "k")
	q.Release()
	want := []bool{true, false, true, false}
	if len(got) != len(want) {
		t.Fatalf("observer got %d decisions, want %d", len(got), len(want))
	}
	for i, d := range got {
		waits := i >= 2
		if d.Acquired != want[i] || d.Source != tierlimit.SourceLocal || (d.Waited > 0) != waits {
			t.Errorf("decision %d = %+v, want Acquired %v, SourceLocal, waited %v", i, d, want[i], waits)
		}
	}
	if _, err := NewConcurrency(1, WithPermitObserver(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("NewConcurrency(WithPermitObserver(nil)) = %v, want ErrInvalidOption", err)
	}
}

// TestPermitCloseRace: Close racing every call never panics or blocks.
func TestPermitCloseRace(t *testing.T) {
	for range 20 {
		c, _ := NewConcurrency(2)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				for j := range 50 {
					var p tierlimit.Permit
					var err error
					if (i+j)%2 == 0 {
						p, err = c.Acquire(ctx, "k")
					} else {
						p, _, err = c.TryAcquire(ctx, "k")
					}
					if err != nil && err != tierlimit.ErrClosed || err != nil && p.Valid() {
						t.Errorf("call racing Close = %v, %v; want nil or ErrClosed with no permit", p, err)
						return
					}
					if p.Valid() {
						p.Release()
						p.Release()
					}
				}
			}()
		}
		c.Close()
		wg.Wait()
		if s := c.Stats(); s.InUse != 0 || s.Waiting != 0 {
			t.Errorf("Stats() after every call returned = %+v, want InUse 0, Waiting 0", s)
		}
	}
}

// waitFor waits until cond holds, at most 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
	}
}

// TestPermitBurst: simultaneous arrivals on a key with permits free get
// them, cold and warm.
func TestPermitBurst(t *testing.T) {
	c, _ := NewConcurrency(3)
	defer c.Close()
	permittest.Burst(t, c)
}

// TestPermitNoPermits: a key its permit func blocks is refused.
func TestPermitNoPermits(t *testing.T) {
	c, _ := NewConcurrency(2, WithPermitFunc(func(k string) int64 {
		if k == "none" {
			return tierlimit.NoPermits
		}
		return tierlimit.DefaultPermits
	}))
	defer c.Close()
	permittest.Blocked(t, c)
}
