package tierlimit_test

// The end-to-end suite of the hybrid tier against a real redis-server:
// fleets of OS processes (this test binary, re-executed) share one limit.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/remote"
)

// memberSpec tells a fleet member what to do.
type memberSpec struct {
	Addr       string
	Limit      tierlimit.Limit
	Keys       int     // 1: the hot key; more: a Zipf-skewed key space
	Zipf       float64 // s parameter of the Zipf distribution (> 1)
	Prefix     string
	Goroutines int
	Start      int64 // unix ns; nobody calls before (runFleet sets it if 0)
	Duration   time.Duration

	// Fault tests (faults_test.go): Redis is killed at KillAt and started
	// again at RestartAt (unix ns).
	Fault                    bool
	KillAt, RestartAt        int64
	Budget, Probe, Heartbeat time.Duration
	Defaults                 bool // go-redis's default client and hybrid's default options, not the above

	// Mode is what each caller asks: "" Allow, and Admitted counts the
	// admissions; "overrun", AllowN(Cost) then, if admitted,
	// Settle(Cost, Cost*3/2), and Admitted counts the tokens used;
	// "atmost", AllowAtMost(Cost), and Admitted counts the tokens granted.
	Mode string
	Cost int64
}

// memberReport is what a fleet member prints when done.
type memberReport struct {
	Admitted map[string]int64 // tokens admitted per key
	Calls    int64
	Errors   int64
	Began    int64  // unix ns at which its callers began
	LastEnd  int64  // unix ns at which the last decision returned
	FirstEnd int64  // unix ns at which the first decision returned
	FellBack int64  // tokens the fallback admitted
	Mode     string // the spec's
	Stats    hybrid.Stats
	// Slots counts the admissions of the hottest keys ("hot", "k0",
	// "k1") per 100 ms from Start: where a shortfall happened.
	Slots map[string][]int64
	First map[string]int64 // unix ns of the hottest keys' first admission
}

// slot is the width of memberReport.Slots' counts.
const slot = 100 * time.Millisecond

func fleetMember(spec string) int {
	var s memberSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// What users start with: go-redis's default client, default options.
	// On a loaded machine (race detector, 3 processes and a busy loop on
	// 2 cores) calls run past the budget: that is a slow Redis, not an
	// outage, and the guarantees under test hold through it.
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	l, err := hybrid.New(rdb, s.Limit, hybrid.WithPrefix(s.Prefix))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	time.Sleep(time.Until(time.Unix(0, s.Start)))
	deadline := time.Unix(0, s.Start).Add(s.Duration)
	var mu sync.Mutex
	rep := memberReport{Mode: s.Mode, Admitted: map[string]int64{}, Slots: map[string][]int64{}, First: map[string]int64{}, Began: time.Now().UnixNano()} // later than Start on a slow machine
	var calls, errs, firstEnd, lastEnd, fellBack atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < s.Goroutines; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			admitted := map[string]int64{}
			slots := map[string][]int64{}
			first := map[string]int64{}
			var zipf *rand.Zipf
			if s.Keys > 1 {
				zipf = rand.NewZipf(rand.New(rand.NewPCG(seed, 7)), s.Zipf, 1, uint64(s.Keys-1))
			}
			for time.Now().Before(deadline) {
				key := "hot"
				if zipf != nil {
					key = "k" + strconv.FormatUint(zipf.Uint64(), 10)
				}
				r, used, err := ask(l, s, key)
				if calls.Add(1) == 1 {
					firstEnd.Store(time.Now().UnixNano())
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				if !r.Allowed && s.Mode != "" {
					time.Sleep(r.RetryAfter) // a caller told when to come back
				}
				if r.Allowed {
					admitted[key] += used
					now := time.Now()
					if key == "hot" || key == "k0" || key == "k1" {
						i := int(now.Sub(time.Unix(0, s.Start)) / slot)
						for len(slots[key]) <= i {
							slots[key] = append(slots[key], 0)
						}
						slots[key][i]++
						if first[key] == 0 {
							first[key] = now.UnixNano()
						}
					}
					lastEnd.Store(max(lastEnd.Load(), now.UnixNano()))
					if r.Source == tierlimit.SourceFallback {
						fellBack.Add(used)
					}
				}
			}
			mu.Lock()
			for k, n := range admitted {
				rep.Admitted[k] += n
			}
			for k, f := range first {
				if rep.First[k] == 0 || f < rep.First[k] {
					rep.First[k] = f
				}
			}
			for k, ns := range slots {
				for len(rep.Slots[k]) < len(ns) {
					rep.Slots[k] = append(rep.Slots[k], 0)
				}
				for i, n := range ns {
					rep.Slots[k][i] += n
				}
			}
			mu.Unlock()
		}(uint64(g))
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return 2
	}
	rep.Calls, rep.Errors, rep.LastEnd, rep.Stats = calls.Load(), errs.Load(), lastEnd.Load(), l.Stats()
	rep.FellBack, rep.FirstEnd = fellBack.Load(), firstEnd.Load()
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// ask makes a fleet member's call of key as s.Mode says, and returns its
// Result and the tokens it used.
func ask(l *hybrid.Limiter, s memberSpec, key string) (tierlimit.Result, int64, error) {
	ctx := context.Background()
	switch s.Mode {
	case "overrun":
		r, err := l.AllowN(ctx, key, s.Cost)
		if err != nil || !r.Allowed {
			return r, 0, err
		}
		used := s.Cost * 3 / 2
		if _, err := l.Settle(ctx, key, s.Cost, used); err != nil {
			return r, 0, err
		}
		return r, used, nil
	case "atmost":
		got, r, err := l.AllowAtMost(ctx, key, s.Cost)
		return r, got, err
	}
	r, err := l.Allow(ctx, key)
	return r, 1, err
}

// runFleet runs members processes with spec and returns their reports and
// the start instant.
func runFleet(t *testing.T, members int, spec memberSpec) ([]memberReport, time.Time) {
	t.Helper()
	if spec.Start == 0 {
		spec.Start = time.Now().Add(500 * time.Millisecond).UnixNano() // time for the processes to start
	}
	start := time.Unix(0, spec.Start)
	outs := runMembers(t, members, spec)
	reports := make([]memberReport, members)
	for i, out := range outs {
		if err := json.Unmarshal(out, &reports[i]); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	return reports, start
}

// runMembers runs members processes with spec and returns what each
// printed.
func runMembers(t *testing.T, members int, spec memberSpec) [][]byte {
	t.Helper()
	raw, _ := json.Marshal(spec)
	outs := make([][]byte, members)
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i := 0; i < members; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), spec.Duration+30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			// A member still running at the deadline is hung: SIGQUIT
			// makes it print its goroutines (to this test's stderr)
			// before it is killed.
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
			cmd.WaitDelay = 5 * time.Second
			cmd.Env = append(os.Environ(), "TIERLIMIT_FLEET_MEMBER="+string(raw))
			cmd.Stderr = os.Stderr
			outs[i], errs[i] = cmd.Output()
			if errs[i] != nil {
				errs[i] = fmt.Errorf("member %d: %v", i, errs[i])
			}
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return outs
}

// fleetTotals sums the members' admissions per key and checks that no
// caller saw an error and that every ledger balances. It returns the sums,
// when the first member's callers began, and when the last admitted
// decision returned.
func fleetTotals(t *testing.T, reports []memberReport, start time.Time) (total map[string]int64, began, last time.Time) {
	t.Helper()
	total = map[string]int64{}
	var first, end int64
	for i, r := range reports {
		var spent int64
		for k, n := range r.Admitted {
			total[k] += n
			spent += n
		}
		if i == 0 || r.Began < first {
			first = r.Began
		}
		end = max(end, r.LastEnd)
		s := r.Stats
		if r.Errors != 0 {
			t.Errorf("member %d: %d errors", i, r.Errors)
		}
		// What the fallback admitted (a breaker that opened) was never
		// leased; settles that overrun use tokens the leases never held
		// (what the bucket lacked is debt).
		fromLeases := spent - r.FellBack + s.ChargedBack // a charge-back is a claim the fallback's admissions spend
		if s.Leased != s.Spent+s.Refunded+s.Lost+s.Held || s.Spent != fromLeases && !(r.Mode == "overrun" && s.Spent <= fromLeases) || s.Held != 0 || s.Lost != 0 {
			t.Errorf("member %d: ledger %+v, admitted %d (%d by the fallback): want leased = spent + refunded, spent = admitted from leases, nothing held or lost", i, s, spent, r.FellBack)
		}
		t.Logf("member %d: began %v after the start, first decision %v after; %d calls, %d admitted (%d by the fallback), %d Redis calls, stats %+v",
			i, time.Unix(0, r.Began).Sub(start), time.Unix(0, r.FirstEnd).Sub(start), r.Calls, spent, r.FellBack, s.RedisCalls, s)
	}
	return total, time.Unix(0, first), time.Unix(0, end)
}

// logSlots logs key's admissions per slot of 100 ms from the start, per
// member: where a shortfall happened.
func logSlots(t *testing.T, reports []memberReport, key string) {
	t.Helper()
	for i, r := range reports {
		t.Logf("member %d: %s admitted per %v: %v", i, key, slot, r.Slots[key])
	}
}

// bucketBound is what one token bucket admits at most over [start, end].
func bucketBound(l tierlimit.Limit, start, end time.Time) int64 {
	return l.Capacity() + int64(float64(l.Rate)*float64(end.Sub(start))/float64(l.Period))
}

// fleetBounds returns the bounds G1 and G2 hold a fleet's admissions to.
// G1's is one bucket's over every instant an admission may have happened:
// from the start to the last admitted decision's return, which on a loaded
// machine can come seconds after the deadline (a decision may wait up to
// its call budget). G2's, per key, is one bucket's over the time demand was
// above the limit and the fleet ran: from when the first member's callers
// began (a slow machine starts processes late), or the key's first
// admission if later, to the deadline.
func fleetBounds(t *testing.T, l tierlimit.Limit, start time.Time, d time.Duration, reports []memberReport, began, last time.Time) (g1 int64, g2 func(key string) int64) {
	t.Helper()
	deadline := start.Add(d)
	t.Logf("the first member began %v after the start; the last admission returned %v after the deadline",
		began.Sub(start), last.Sub(deadline))
	if !began.Before(deadline) {
		t.Fatalf("no member began before the deadline")
	}
	g2 = func(key string) int64 {
		from := start
		if began.After(from) {
			from = began
		}
		// The key's demand is met from its first admission: on a loaded
		// machine (the race detector, other tests' processes) Redis and
		// the members may not run at all for the first tens of ms, and
		// one bucket does not refill above its capacity meanwhile.
		var first int64
		for _, r := range reports {
			if f := r.First[key]; f != 0 && (first == 0 || f < first) {
				first = f
			}
		}
		if f := time.Unix(0, first); first != 0 && f.After(from) {
			t.Logf("key %s: first admitted %v after the start", key, f.Sub(start))
			from = f
		}
		return bucketBound(l, from, deadline)
	}
	return bucketBound(l, start, last), g2
}

// TestFleetHotKey is G1 and G2: three processes with 16 goroutines each on
// one hot key, demand far above the limit, for 3 s, with default options
// and go-redis's default client, on an idle machine and beside a busy
// loop: the fleet admits at most what one bucket allows and at least 95%
// of it.
func TestFleetHotKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 3 s fleets")
	}
	spec := memberSpec{Limit: tierlimit.PerSecond(1000), Keys: 1, Prefix: "g1:", Goroutines: 16, Duration: 3 * time.Second}
	eachLoad(t, spec, func(t *testing.T, reports []memberReport, total map[string]int64, bound int64, demandedBy func(string) int64) {
		got, demanded := total["hot"], demandedBy("hot")
		var calls, redisCalls int64
		for _, r := range reports {
			calls += r.Calls
			redisCalls += r.Stats.RedisCalls
		}
		t.Logf("fleet: %d admitted, bound %d, %.1f%% of the %d the bucket allowed while demanded; %d decisions, %.1f Redis calls per 1000 decisions",
			got, bound, 100*float64(got)/float64(demanded), demanded, calls, 1000*float64(redisCalls)/float64(calls))
		if got > bound {
			t.Errorf("G1: admitted %d > bound %d", got, bound)
		}
		if float64(got) < 0.95*float64(demanded) {
			t.Errorf("G2: admitted %d < 95%% of %d", got, demanded)
			logSlots(t, reports, "hot")
		}
	})
}

// TestFleetZipf is G1 and G2 over 1000 keys with Zipf-skewed demand, with
// default options and go-redis's default client, on an idle machine and
// beside a busy loop: no key is over-admitted, and the hot keys get at
// least 95% of their bound.
func TestFleetZipf(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 3 s fleets")
	}
	spec := memberSpec{Limit: tierlimit.PerSecond(100), Keys: 1000, Zipf: 1.1, Prefix: "zipf:", Goroutines: 16, Duration: 3 * time.Second}
	eachLoad(t, spec, func(t *testing.T, reports []memberReport, total map[string]int64, bound int64, demandedBy func(string) int64) {
		over, hot := 0, 0
		for k, n := range total {
			if n > bound {
				over++
				t.Errorf("G1: key %s admitted %d > bound %d", k, n, bound)
			}
			if k == "k0" || k == "k1" {
				hot++
				demanded := demandedBy(k)
				t.Logf("hot key %s: %d admitted, %.1f%% of the %d allowed while demanded", k, n, 100*float64(n)/float64(demanded), demanded)
				if float64(n) < 0.95*float64(demanded) {
					t.Errorf("G2: hot key %s admitted %d < 95%% of %d", k, n, demanded)
					logSlots(t, reports, k)
				}
			}
		}
		if hot != 2 {
			t.Fatalf("the two hottest keys saw no traffic: %d keys seen", len(total))
		}
		t.Logf("%d keys seen, %d over the bound", len(total), over)
	})
}

// eachLoad runs a fleet of three members with spec on a Redis of its own,
// once on an idle machine and once beside a busy loop, and hands check
// each run's reports, its admissions per key and the bounds G1 and G2 hold
// them to (fleetBounds).
func eachLoad(t *testing.T, spec memberSpec, check func(t *testing.T, reports []memberReport, total map[string]int64, bound int64, demanded func(key string) int64)) {
	for _, busy := range []bool{false, true} {
		t.Run(loadName(busy), func(t *testing.T) {
			spec.Addr = redistest.Start(t).Addr
			stop := busyLoop(busy)
			reports, start := runFleet(t, 3, spec)
			stop()
			total, began, last := fleetTotals(t, reports, start)
			bound, demanded := fleetBounds(t, spec.Limit, start, spec.Duration, reports, began, last)
			check(t, reports, total, bound, demanded)
		})
	}
}

func loadName(busy bool) string {
	if busy {
		return "busy"
	}
	return "idle"
}

// newInstances returns n hybrid limiters of limit on the Redis at addr, each
// with its own go-redis client (default options): n instances of a fleet in
// one process. The test closes the limiters; the clients close at cleanup.
func newInstances(t *testing.T, addr string, n int, limit tierlimit.Limit, opts ...hybrid.Option) []*hybrid.Limiter {
	t.Helper()
	limiters := make([]*hybrid.Limiter, n)
	for i := range limiters {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		l, err := hybrid.New(rdb, limit, opts...)
		if err != nil {
			t.Fatal(err)
		}
		limiters[i] = l
	}
	return limiters
}

// busyLoop keeps one core busy, if busy is set, until stop is called (at
// most a minute): the machine a fleet test runs on is loaded, as a
// production host often is.
func busyLoop(busy bool) (stop func()) {
	if !busy {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(time.Minute)
		x := 0
		for time.Now().Before(deadline) {
			select {
			case <-done:
				return
			default:
			}
			for i := range 100_000 {
				x ^= i
			}
		}
		_ = x
	}()
	return func() { close(done); wg.Wait() }
}

// TestRefillWhileHeld is G1 in the case the lease ledger is for: instances
// hold leases while demand pauses long enough for the bucket to refill,
// then demand surges. Over the surge the fleet may admit what the bucket
// held and what the instances held at its start, plus the refill. The
// ledger (on by default) keeps the level plus the tokens held within the
// capacity, so that is at most one bucket's capacity + rate·T, with
// WithLimits too (every limit's bucket keeps its ledger). Without the
// ledger the bucket would refill to full under the held tokens, and the
// fleet admit up to the tokens held at the surge's start more
// (docs/design.md, G1).
// Default options and go-redis's default client.
func TestRefillWhileHeld(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []tierlimit.Limit // WithLimits
	}{
		{"default", nil},
		{"WithLimits", []tierlimit.Limit{tierlimit.PerHour(1_000_000)}},
		// The extra binds: the same rate with a burst of 60. Without its
		// own ledger its bucket would refill to 60 under the tokens held,
		// and the surge admit them on top of its bound.
		{"WithLimits binding", []tierlimit.Limit{tierlimit.PerSecond(100).WithBurst(60)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, bound, held := surgeAfterPause(t, tc.extra...)
			if held == 0 {
				t.Fatal("no lease held when the surge began: the test shows nothing")
			}
			if got > bound {
				t.Errorf("G1: admitted %d over the surge > bound %d", got, bound)
			}
			// Nothing is stranded: the tokens held are spent (the refill
			// of the surge may not be: a key Redis runs dry for is blocked
			// until a lease's worth has accrued).
			if got < held {
				t.Errorf("G2: admitted %d over the surge, want at least the %d held at its start", got, held)
			}
		})
	}
}

// surgeAfterPause has 3 instances (default options, each its own default
// client) ask a 100/s key 25 times a second each for 600 ms, so that their
// leases grow past what they spend, then pause for half a lease TTL (the
// bucket refills meanwhile, the leases are kept), then admit what they can
// for 300 ms. It returns what they admitted in the surge, one bucket's
// bound over it (the tightest of the key's limits, with extra as
// WithLimits), and the tokens the instances held when it began.
func surgeAfterPause(t *testing.T, extra ...tierlimit.Limit) (got, bound, held int64) {
	addr := redistest.Start(t).Addr
	ctx := context.Background()
	limit := tierlimit.PerSecond(100)
	opts := []hybrid.Option{hybrid.WithPrefix("held:")}
	if len(extra) > 0 {
		opts = append(opts, hybrid.WithLimits(extra...))
	}
	ls := newInstances(t, addr, 3, limit, opts...)
	for _, l := range ls {
		defer l.Close()
	}
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
			for range 15 {
				if _, err := l.Allow(ctx, "k"); err != nil {
					t.Error(err)
					return
				}
				<-tick.C
			}
		}()
	}
	wg.Wait()
	time.Sleep(hybrid.DefaultLeaseTTL / 2) // the bucket refills to full at 100/s
	for _, l := range ls {
		held += l.Stats().Held
	}
	const surge = 300 * time.Millisecond
	var admitted atomic.Int64
	start := time.Now()
	for _, l := range ls {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < surge {
					r, err := l.Allow(ctx, "k")
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	end := time.Now()
	got, bound = admitted.Load(), bucketBound(limit, start, end)
	for _, l := range extra {
		bound = min(bound, bucketBound(l, start, end))
	}
	t.Logf("surge of %v: %d admitted, bound %d, %d held at its start", end.Sub(start), got, bound, held)
	return got, bound, held
}

// TestFleetLedger is G5: with a bucket that does not refill during the test,
// after every instance's Close, Redis holds exactly capacity - admitted:
// nothing lost, nothing minted.
func TestFleetLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 1 s fleet")
	}
	s := redistest.Start(t)
	limit := tierlimit.PerDay(1).WithBurst(20_000) // refills one token a day
	reports, start := runFleet(t, 3, memberSpec{
		Addr: s.Addr, Limit: limit, Keys: 50, Zipf: 1.2, Prefix: "g5:", Goroutines: 16, Duration: time.Second,
	})
	total, _, _ := fleetTotals(t, reports, start)
	rdb := s.Client(t)
	// The checker reads Redis through the token bucket hybrid leases
	// from: a peek, which never falls back.
	b, err := remote.NewTokenBucket(rdb, limit, remote.WithPrefix("g5:"))
	if err != nil {
		t.Fatal(err)
	}
	for k, n := range total {
		r, err := b.AllowN(context.Background(), k, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := limit.Capacity() - n; r.Remaining != want {
			t.Errorf("G5: key %s: Redis holds %d after %d admitted, want %d", k, r.Remaining, n, want)
		}
	}
	t.Logf("%d keys: Redis holds capacity - admitted for each", len(total))
}

// liveHeap returns the bytes the heap holds live after a garbage
// collection: the heap the collector marked (runtime/metrics), not
// MemStats.HeapAlloc, which counts what other goroutines allocated between
// the collection and the read as well (on a loaded machine, megabytes).
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestMemoryBounded is G6: a million distinct keys through one limiter with
// 10,000 local keys: the heap stays under the documented bound, and Close
// leaves no goroutine behind.
func TestMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a million keys")
	}
	keys := 1_000_000
	if raceEnabled {
		keys = 200_000 // the race detector is 10x slower; still 20x max keys
	}
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	goroutines := runtime.NumGoroutine()
	const maxKeys = 10_000
	// Default options and client: calls that miss the budget on a loaded
	// machine leave denials and debts in the table too, which the bound
	// must hold as well.
	l, err := hybrid.New(rdb, tierlimit.PerMinute(10), hybrid.WithMaxKeys(maxKeys), hybrid.WithPrefix("g6:"))
	if err != nil {
		t.Fatal(err)
	}
	before := liveHeap()
	var next atomic.Int64
	var peak atomic.Uint64
	var peakGoroutines atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(keys); i = next.Add(1) {
				if _, err := l.Allow(context.Background(), "user-"+strconv.FormatInt(i, 10)); err != nil {
					t.Error(err)
					return
				}
				if i%50_000 == 0 {
					peak.Store(max(peak.Load(), liveHeap()))
					peakGoroutines.Store(max(peakGoroutines.Load(), int64(runtime.NumGoroutine())))
				}
			}
		}()
	}
	wg.Wait()
	grew := int64(peak.Load()) - int64(before)
	// hybrid.WithMaxKeys's bound: n × 1 KiB + 8 MiB.
	const bytesPerKey, baseBytes = 1024, 8 << 20
	bound := int64(maxKeys)*bytesPerKey + baseBytes
	t.Logf("%d keys: live heap grew at most %d bytes (bound %d = %d keys × %d + %d); at most %d goroutines; %+v",
		keys, grew, bound, maxKeys, bytesPerKey, baseBytes, peakGoroutines.Load(), l.Stats())
	if grew > bound {
		t.Errorf("G6: heap grew %d bytes > bound %d", grew, bound)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("%d goroutines after Close, %d before", n, goroutines)
	}
}

// TestSimulatedFleet is G1 and G2 at fleet scale: many instances in one
// process, each with its own go-redis client (default options) and its own
// limiter (default options but WithMaxKeys, which only bounds memory: one
// key is used), one caller each on one hot key, as fast as it can. One
// Redis serving many instances' claims is when calls are slow: a slow call
// must not mint tokens. The fleet admits at most one bucket's bound (plus
// what a round trip's worth of rate may land late) and at least 90% of it,
// on an idle machine and beside a busy loop. Redis calls and fallback
// decisions are reported.
//
// A caller yields the processor after each decision, as a request handler
// does when it next waits on its connection: 300 goroutines that never
// wait, on 2 cores, starve the goroutines that read Redis's answers (the
// runtime's network poller feeds the global run queue, which a busy
// processor serves once in 61 turns of 10 ms), so that answers take
// seconds to be read and the instances' breakers open on what looks like
// silence. That case, "spinning", is opt-in (TIERLIMIT_FLEET_SIM=1): it
// fails both ways (docs/design.md, G1).
func TestSimulatedFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 4 s of load three times")
	}
	for _, c := range []struct {
		name        string
		busy, spins bool
	}{
		{"idle", false, false},
		{"busy", true, false},
		{"spinning", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.spins && os.Getenv("TIERLIMIT_FLEET_SIM") != "1" {
				t.Skip("set TIERLIMIT_FLEET_SIM=1: callers that never yield starve the network poller (docs/design.md, G1)")
			}
			stop := busyLoop(c.busy)
			defer stop()
			simulateFleet(t, c.spins)
		})
	}
}

// simulateFleet runs TestSimulatedFleet's fleet; with spins, its callers
// never yield the processor.
func simulateFleet(t *testing.T, spins bool) {
	instances := 300
	if raceEnabled {
		instances = 60 // the race detector's cost per goroutine
	}
	s := redistest.Start(t)
	limit := tierlimit.PerSecond(1000)
	const d = 4 * time.Second
	limiters := newInstances(t, s.Addr, instances, limit, hybrid.WithMaxKeys(1000))
	start := time.Now().Add(100 * time.Millisecond)
	deadline := start.Add(d)
	var admitted, calls, errs, lastEnd, fellBack atomic.Int64
	var wg sync.WaitGroup
	for _, l := range limiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start))
			for time.Now().Before(deadline) {
				r, err := l.Allow(context.Background(), "hot")
				calls.Add(1)
				switch {
				case err != nil:
					errs.Add(1)
				case r.Allowed:
					admitted.Add(1)
					lastEnd.Store(max(lastEnd.Load(), time.Now().UnixNano()))
					if r.Source == tierlimit.SourceFallback {
						fellBack.Add(1)
					}
				}
				if !spins {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	var redisCalls, fallback, redisErrors, chargedBack, opens int64
	for _, l := range limiters {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		st := l.Stats()
		redisCalls += st.RedisCalls
		fallback += st.Fallback
		redisErrors += st.RedisErrors
		chargedBack += st.ChargedBack
		opens += st.BreakerOpens
	}
	last := time.Unix(0, lastEnd.Load())
	// A claim granted just before the deadline is spent by decisions that
	// return up to a round trip later: a round trip's worth of rate.
	slack := limit.Rate * int64(50*time.Millisecond) / int64(limit.Period)
	bound := bucketBound(limit, start, last) + slack
	demanded := bucketBound(limit, start, deadline)
	got := admitted.Load()
	t.Logf("%d instances: %d admitted, %.3f× one bucket over the run (%d), bound %d; %d decisions, %d errors; "+
		"%d Redis calls (%.1f per 1000 decisions), %d Redis errors, %d breaker openings, %d fallback decisions, %d admitted, %d charged back; last admission %v after the deadline",
		instances, got, float64(got)/float64(demanded), demanded, bound, calls.Load(), errs.Load(),
		redisCalls, 1000*float64(redisCalls)/float64(calls.Load()), redisErrors, opens, fallback, fellBack.Load(), chargedBack, last.Sub(deadline))
	if errs.Load() != 0 {
		t.Errorf("%d errors reached callers, want 0", errs.Load())
	}
	if got > bound {
		t.Errorf("G1: the fleet admitted %d > one bucket's %d", got, bound)
	}
	if float64(got) < 0.9*float64(demanded) {
		t.Errorf("G2: the fleet admitted %d < 90%% of %d", got, demanded)
	}
}

// TestSmoothSaturation is G2's smoothness: PerMinute(2_000_000) saturated
// by three instances (each its own go-redis client, default options): once
// the burst is spent, every slot of 1/20 of the period (3 s) admits 0.4–1.6×
// what the rate gives it, rather than nothing for seconds and then a lease
// bound's worth at once, at most one Redis call per lease (G3); and by the
// end of every 100 ms bin the fleet has admitted at most B + r·t (G1). The
// burst is spent once the fleet has admitted within a second's refill of
// all it may (the burst and the refill so far): beside a busy loop the
// callers spend it slowly, and a bin's count told nothing (a run took the
// burst as spent at 3.8 s and its first slot, holding the rest, admitted
// 2.18×). An admission counts when its call returns. The load runs 12 s,
// or until three slots follow the burst's end if that is later, up to 30 s
// (the burst took 8.4–10.5 s to spend under -race beside two busy loops).
//
// Each caller yields after a decision, as a request handler does when it
// waits on its connection (TestSimulatedFleet's callers do too). Twelve
// that never yield on two cores starve the goroutines that read Redis's
// answers (docs/design.md, G1, "Where it does not hold"): under -race
// beside three busy loops 46–65 claims per instance then ran past the call
// budget (none with yielding callers), and first slots of 1.69× (CI at
// 4cb5533) and 2.04× (1 run in 12), which G1 at the slot's end bounds by
// about 1.46×, were seen without the G1 check, or the Stats a failure now
// logs, to say more.
func TestSmoothSaturation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 12 s of load")
	}
	s := redistest.Start(t)
	limit := tierlimit.PerMinute(2_000_000)
	const (
		instances, callers = 3, 4
		slot               = 3 * time.Second // Period/20
		bin                = 100 * time.Millisecond
		d                  = 12 * time.Second
		most               = 30 * time.Second
	)
	limiters := newInstances(t, s.Addr, instances, limit, hybrid.WithPrefix("smooth:"))
	start := time.Now().Add(100 * time.Millisecond)
	var bins [most / bin]atomic.Int64
	var calls, errs, admitted, spent atomic.Int64
	perBin := limit.Rate * int64(bin) / int64(limit.Period)
	// The burst is spent (spent: its instant) once the fleet admitted all
	// it may but a second's refill: the burst, and the refill since start.
	admit := func(now time.Time) {
		n := admitted.Add(1)
		if spent.Load() == 0 && n >= limit.Capacity()+limit.Rate*int64(now.Sub(start))/int64(limit.Period)-10*perBin {
			spent.CompareAndSwap(0, now.UnixNano())
		}
	}
	// The load ends d after the start, or three slots and a bin after the
	// burst was spent if that is later, and at most after most.
	ended := func(now time.Time) bool {
		end := start.Add(most)
		if at := spent.Load(); at != 0 {
			end = later(start.Add(d), time.Unix(0, at).Add(3*slot+bin))
		}
		return !now.Before(end) || !now.Before(start.Add(most))
	}
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(start))
				for !ended(time.Now()) {
					r, err := l.Allow(context.Background(), "hot")
					done := time.Now()
					calls.Add(1)
					switch {
					case err != nil:
						errs.Add(1)
					case r.Allowed:
						bins[min(int(done.Sub(start)/bin), len(bins)-1)].Add(1)
						admit(done)
					}
					// As a request handler waits on its connection: callers
					// that never yield, more of them than cores, starve the
					// goroutines reading Redis's answers (docs/design.md,
					// G1, "Where it does not hold").
					runtime.Gosched()
				}
			}()
		}
	}
	wg.Wait()
	var redisCalls, leased int64
	stats := make([]hybrid.Stats, len(limiters))
	for i, l := range limiters {
		l.Close()
		stats[i] = l.Stats()
		redisCalls += stats[i].RedisCalls
		leased += stats[i].Leased
	}
	defer func() {
		if t.Failed() {
			for i, st := range stats {
				t.Logf("instance %d: %+v", i, st)
			}
		}
	}()
	if errs.Load() != 0 {
		t.Errorf("%d errors reached callers, want 0", errs.Load())
	}
	// G1: by the end of every bin, at most the burst and the refill so far.
	var cum int64
	for j := range bins {
		cum += bins[j].Load()
		if most := limit.Capacity() + limit.Rate*int64(time.Duration(j+1)*bin)/int64(limit.Period); cum > most {
			t.Errorf("%d admitted by %v, over one bucket's %d", cum, time.Duration(j+1)*bin, most)
			break
		}
	}
	// The slots begin after the bin in which the burst was spent.
	last := 0
	for j := range bins {
		if bins[j].Load() > 0 {
			last = j + 1
		}
	}
	at := spent.Load()
	if at == 0 {
		t.Fatalf("the burst of %d was never spent: %d admitted", limit.Capacity(), admitted.Load())
	}
	first := int(time.Unix(0, at).Sub(start)/bin) + 1
	slots := (last - first) / int(slot/bin)
	if slots < 2 {
		t.Fatalf("the burst took %v to spend: fewer than 2 slots of %v left", time.Duration(first)*bin, slot)
	}
	share := limit.Rate * int64(slot) / int64(limit.Period)
	var got []string
	for i := range slots {
		var n int64
		for j := first + i*int(slot/bin); j < first+(i+1)*int(slot/bin); j++ {
			n += bins[j].Load()
		}
		got = append(got, fmt.Sprintf("%.2f", float64(n)/float64(share)))
		if float64(n) < 0.4*float64(share) || float64(n) > 1.6*float64(share) {
			t.Errorf("slot %d: %d admitted, want 0.4–1.6× the rate's %d", i, n, share)
		}
	}
	t.Logf("burst spent after %v; admitted per %v slot, in shares of %d: %s; %d decisions, %d Redis calls for %d tokens leased",
		time.Duration(first)*bin, slot, share, strings.Join(got, ", "), calls.Load(), redisCalls, leased)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
