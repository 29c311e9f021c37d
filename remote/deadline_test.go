package remote

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/canary"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// BenchmarkDeadline is a call with a caller's context that has a deadline,
// on a loopback Redis with go-redis's default client: AllowN, alone and
// from parallel callers, and TryAcquire with its Release. It is the cost
// of bounding a call by the caller's deadline whatever the client does.
func BenchmarkDeadline(b *testing.B) {
	s := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	l, err := NewTokenBucket(rdb, tierlimit.PerSecond(1_000_000_000), WithPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	allow := func() {
		if _, err := l.AllowN(ctx, "k", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("AllowN", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			allow()
		}
	})
	b.Run("AllowN/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				allow()
			}
		})
	})
	c, err := NewConcurrency(rdb, 1<<20, WithPermitPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.Run("TryAcquire+Release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, ok, err := c.TryAcquire(ctx, "k")
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			p.Release()
		}
	})
}

// every is every method of a rate limiter of this package.
type every interface {
	decider
	AllowAll(ctx context.Context, takes ...tierlimit.Take) (tierlimit.Result, error)
	AllowAtMost(ctx context.Context, key string, n int64) (int64, tierlimit.Result, error)
	WaitN(ctx context.Context, key string, n int64) (tierlimit.Result, error)
	Settle(ctx context.Context, key string, charged, used int64) (tierlimit.Result, error)
}

// rateMethods calls every method of a rate limiter with a context, each on
// a key of its own (its name), charging what stalledCharge says.
var rateMethods = []struct {
	name     string
	deadline time.Duration
	call     func(ctx context.Context, l every, key string) error
}{
	{"AllowN", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, err := l.AllowN(ctx, key, stalledCharge)
		return err
	}},
	{"Allow", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, err := l.Allow(ctx, key)
		return err
	}},
	{"AllowAll", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, err := l.AllowAll(ctx, tierlimit.Take{Key: key, N: 1}, tierlimit.Take{Key: key + "/org", N: 1})
		return err
	}},
	{"AllowAtMost", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, _, err := l.AllowAtMost(ctx, key, 2)
		return err
	}},
	{"WaitN", 500 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, err := l.WaitN(ctx, key, 1)
		return err
	}},
	{"Settle", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		_, err := l.Settle(ctx, key, 2, 1)
		return err
	}},
	{"Reset", 300 * time.Millisecond, func(ctx context.Context, l every, key string) error {
		return l.Reset(ctx, key)
	}},
}

// stalledCharge is what the stalled AllowN charges, of stalledLimit.
const stalledCharge = 3

// stalledLimit refills nothing to speak of within the test, so that a
// key's level tells how many times a charge ran.
var stalledLimit = tierlimit.PerDay(10)

// Bounds of the stalled methods besides their deadline: the scheduling
// delay the canary measures comes on top of each.
const (
	overDeadline = 50 * time.Millisecond
	closeBound   = 1500 * time.Millisecond
)

// stallPause is how long the CLIENT PAUSE stall lasts.
const stallPause = 5 * time.Second

// TestStalledRedisDeadlines: with go-redis's default client (which ignores
// context deadlines and waits 3 s for a reply) and Redis stalled by CLIENT
// PAUSE ALL or SIGSTOP, every method with a context, of every limiter of
// the package, returns its context's error within its deadline and
// overDeadline (and the scheduling delay a canary measures), as does an
// AllowN whose context is cancelled; a
// Concurrency's Release returns within releaseTimeout and its Close, with
// a renewal in flight, within closeBound. Once the stall ends, the
// goroutines the calls left end too; the abandoned AllowN charged its key
// at most once; and the Concurrency's abandoned acquisitions hold nothing:
// its InUse is back to 0, and a new limiter gets every permit of the key
// within the TTL.
func TestStalledRedisDeadlines(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis for seconds")
	}
	faults := []struct {
		name  string
		begin func(t *testing.T, s *redistest.Server) (end func())
	}{
		{"client pause all", func(t *testing.T, s *redistest.Server) func() {
			admin := s.Client(t)
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", stallPause.Milliseconds(), "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			return func() { // the pause ends by itself
				for admin.Ping(context.Background()).Err() != nil {
				}
			}
		}},
		{"sigstop", func(t *testing.T, s *redistest.Server) func() {
			s.Pause()
			return s.Resume
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
			defer rdb.Close()
			ctx := context.Background()
			limiters := make([]every, len(algorithms))
			for i, alg := range algorithms {
				d, err := alg.new(rdb, stalledLimit, WithPrefix("stalled:"))
				if err != nil {
					t.Fatal(err)
				}
				limiters[i] = d.(every)
				if _, err := d.Allow(ctx, "warm"); err != nil { // the script loaded
					t.Fatal(err)
				}
			}
			const ttl = 2 * time.Second
			c, err := NewConcurrency(rdb, 2, WithPermitTTL(ttl), WithPermitPrefix("stalled:"))
			if err != nil {
				t.Fatal(err)
			}
			released, _, err := c.TryAcquire(ctx, "released")
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.TryAcquire(ctx, "held"); err != nil { // renewed during the stall
				t.Fatal(err)
			}
			base := runtime.NumGoroutine()
			canaryBird := canary.Start()
			defer canaryBird.Stop()

			type outcome struct {
				what       string
				took, want time.Duration
				late       time.Duration
				err        error
				wantErr    error
			}
			var (
				mu       sync.Mutex
				outcomes []outcome
				wg       sync.WaitGroup
			)
			// run times call, with the scheduling delay of the stall so far
			// (the canary's worst lateness since it began: the calls run
			// at once, each beside all the others).
			run := func(what string, want time.Duration, wantErr error, call func() error) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					err := call()
					o := outcome{what: what, took: time.Since(start), want: want, err: err, wantErr: wantErr}
					o.late = canaryBird.Worst()
					mu.Lock()
					outcomes = append(outcomes, o)
					mu.Unlock()
				}()
			}
			canaryBird.Reset()
			end := f.begin(t, s)
			for i, alg := range algorithms {
				for _, m := range rateMethods {
					l := limiters[i]
					run(alg.name+"."+m.name, m.deadline+overDeadline, context.DeadlineExceeded, func() error {
						ctx, cancel := context.WithTimeout(ctx, m.deadline)
						defer cancel()
						return m.call(ctx, l, m.name)
					})
				}
			}
			for _, m := range []struct {
				name string
				call func(ctx context.Context) error
			}{
				{"TryAcquire", func(ctx context.Context) error { _, _, err := c.TryAcquire(ctx, "abandoned"); return err }},
				{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, "abandoned"); return err }},
			} {
				run("Concurrency."+m.name, 300*time.Millisecond+overDeadline, context.DeadlineExceeded, func() error {
					ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
					return m.call(ctx)
				})
			}
			// A context cancelled rather than past its deadline (a client
			// gone) ends the call as well.
			const cancelAfter = 200 * time.Millisecond
			run("TokenBucket.AllowN cancelled", cancelAfter+overDeadline, context.Canceled, func() error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				time.AfterFunc(cancelAfter, cancel)
				_, err := limiters[0].AllowN(ctx, "cancelled", 1)
				return err
			})
			run("Permit.Release", min(ttl, releaseTimeout)+overDeadline, nil, func() error { released.Release(); return nil })
			time.Sleep(ttl / 2) // a renewal in flight
			run("Concurrency.Close", closeBound, nil, c.Close)
			wg.Wait()
			end()
			for _, o := range outcomes {
				if !errors.Is(o.err, o.wantErr) || (o.wantErr == nil) != (o.err == nil) {
					t.Errorf("%s on a stalled Redis = %v, want %v", o.what, o.err, o.wantErr)
				}
				if o.took > o.want+o.late {
					t.Errorf("%s on a stalled Redis took %v, want at most %v + %v (this process's scheduling delay)", o.what, o.took, o.want, o.late)
				}
			}
			slowest := outcomes[0]
			for _, o := range outcomes {
				if o.took-o.want > slowest.took-slowest.want {
					slowest = o
				}
			}
			t.Logf("%d calls; the one nearest its bound: %s took %v of %v (scheduling delay %v)",
				len(outcomes), slowest.what, slowest.took, slowest.want, slowest.late)

			// The client gives a stalled call up after its ReadTimeout (3 s).
			deadline := time.Now().Add(15 * time.Second)
			for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > base {
				t.Errorf("%d goroutines after the stall, want at most %d as before it", n, base)
			}
			for i, alg := range algorithms {
				res, err := limiters[i].AllowN(ctx, "AllowN", 0)
				if err != nil {
					t.Fatal(err)
				}
				if full := stalledLimit.Rate; res.Remaining != full && res.Remaining != full-stalledCharge {
					t.Errorf("%s: the abandoned AllowN(%d) left %d of %d, want %d or %d (charged at most once)",
						alg.name, stalledCharge, res.Remaining, full, full, full-stalledCharge)
				}
			}
			if in := c.Stats().InUse; in != 1 {
				t.Errorf("InUse after the stall = %d, want 1 (the permit held)", in)
			}
			again, err := NewConcurrency(rdb, 2, WithPermitTTL(ttl), WithPermitPrefix("stalled:"))
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			free := time.Now().Add(ttl + time.Second)
			for got := 0; got < 2; {
				_, ok, err := again.TryAcquire(ctx, "abandoned")
				switch {
				case err != nil:
					t.Fatal(err)
				case ok:
					got++
				case time.Now().After(free):
					t.Fatalf("%d of 2 permits of the abandoned acquisitions' key free %v after the stall, want 2", got, ttl+time.Second)
				default:
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
}

// TestStalledRedisClose: a Concurrency's Close, with go-redis's default
// client, permits held on several keys and their renewal in flight on a
// Redis paused by CLIENT PAUSE 8000 ALL, returns within closeBound (and
// the scheduling delay a canary measures), and the goroutines the
// renewal left end once the pause does.
func TestStalledRedisClose(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses Redis for 8 s")
	}
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	ctx := context.Background()
	const ttl = 300 * time.Millisecond // renewals every 100 ms
	c, err := NewConcurrency(rdb, 10, WithPermitTTL(ttl), WithPermitPrefix("close:"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if _, ok, err := c.TryAcquire(ctx, key); !ok || err != nil {
			t.Fatalf("TryAcquire(%s) = %v, %v; want true, nil", key, ok, err)
		}
	}
	base := runtime.NumGoroutine()
	bird := canary.Start()
	defer bird.Stop()
	if err := s.Client(t).Do(ctx, "CLIENT", "PAUSE", 8000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl) // a renewal in flight, stalled
	bird.Reset()
	start := time.Now()
	err = c.Close()
	took, late := time.Since(start), bird.Worst()
	if err != nil {
		t.Errorf("Close = %v, want nil", err)
	}
	if took > closeBound+late {
		t.Errorf("Close on a paused Redis took %v, want at most %v + %v (this process's scheduling delay)", took, closeBound, late)
	}
	t.Logf("Close took %v (scheduling delay %v)", took, late)
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Errorf("%d goroutines after the pause, want at most %d as before it", n, base)
	}
}
