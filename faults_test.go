package tierlimit_test

// The fault suite of degraded mode (G4) against real redis-server processes:
// Redis killed and restarted empty under a fleet's load, paused, slow,
// flushed, behind a proxy that resets connections, and refusing a
// misconfigured client. Every test is bounded in time.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/hybrid"
	"github.com/tierlimit/tierlimit/internal/histogram"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/remote"
)

// The phases of a kill test, by when a decision started.
const (
	phaseBefore   = iota // Redis up
	phaseFailing         // Redis dead, the breaker not yet open
	phaseOpen            // Redis dead, the breaker open
	phaseRestored        // Redis started again
	phases
)

var phaseNames = [phases]string{"before", "failing", "open", "restored"}

// faultReport is what a fault-test member prints.
type faultReport struct {
	Errors     int64
	Hist       [phases]histogram.Histogram
	Bins       []int64 // tokens admitted per binWidth since Start
	FirstOK    int64   // unix ns at which the first Redis call after RestartAt returned without error
	FirstLease int64   // the same for the first claim or refill
	Opened     int64   // unix ns the breaker first opened
	HeldAtKill int64
	Share      tierlimit.Limit // the fallback limit at KillAt
	Stats      hybrid.Stats
	Decided    []int64 // decisions started per slotWidth since Start
	Waited     []int64 // of which took a millisecond or more: not made locally
	LastEnd    int64   // unix ns at which the last admitted decision returned
}

const (
	binWidth  = 10 * time.Millisecond
	slotWidth = 250 * time.Millisecond
)

// faultMember runs one instance of a fleet through a Redis kill.
func faultMember(raw string) int {
	var s memberSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: s.Goroutines, ContextTimeoutEnabled: true})
	if s.Defaults {
		rdb = redis.NewClient(&redis.Options{Addr: s.Addr})
	}
	defer rdb.Close()
	killAt, restartAt := time.Unix(0, s.KillAt), time.Unix(0, s.RestartAt)
	var opened, firstOK, firstLease atomic.Int64
	obs := &tierlimit.Observer{
		Breaker: func(c tierlimit.BreakerChange) {
			if c.To == tierlimit.BreakerOpen {
				opened.CompareAndSwap(0, time.Now().UnixNano())
			}
		},
		// The first Redis call to succeed once the restart began: Redis
		// is back for this instance (the test's own PING may come later).
		// Not from killAt: a call may succeed between it and the kill.
		RedisCall: func(c tierlimit.RedisCall) {
			if now := time.Now(); c.Err == nil && now.After(restartAt) {
				firstOK.CompareAndSwap(0, now.UnixNano())
				if c.Op == "claim" || c.Op == "refill" {
					firstLease.CompareAndSwap(0, now.UnixNano())
				}
			}
		},
	}
	opts := []hybrid.Option{hybrid.WithPrefix(s.Prefix), hybrid.WithObserver(obs)}
	if !s.Defaults {
		opts = append(opts, hybrid.WithCallBudget(s.Budget), hybrid.WithProbeInterval(s.Probe), hybrid.WithHeartbeat(s.Heartbeat))
	}
	l, err := hybrid.New(rdb, s.Limit, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	start := time.Unix(0, s.Start)
	deadline := start.Add(s.Duration)
	var rep faultReport
	var mu sync.Mutex
	rep.Bins = make([]int64, s.Duration/binWidth+1)
	rep.Decided = make([]int64, s.Duration/slotWidth+1)
	rep.Waited = make([]int64, s.Duration/slotWidth+1)
	time.AfterFunc(time.Until(killAt), func() {
		st := l.Stats()
		mu.Lock()
		rep.HeldAtKill, rep.Share = st.Held, st.FallbackLimit
		mu.Unlock()
	})
	time.Sleep(time.Until(start))
	var wg sync.WaitGroup
	for g := 0; g < s.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h [phases]histogram.Histogram
			bins := make([]int64, len(rep.Bins))
			decided, waited := make([]int64, len(rep.Decided)), make([]int64, len(rep.Waited))
			var errs, lastEnd int64
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				r, err := l.Allow(context.Background(), "hot")
				took := time.Since(t0)
				phase := phaseRestored
				switch o := opened.Load(); {
				case t0.Before(killAt):
					phase = phaseBefore
				case o == 0 || t0.UnixNano() < o:
					phase = phaseFailing
				case t0.Before(restartAt):
					phase = phaseOpen
				}
				h[phase].Add(took)
				slot := t0.Sub(start) / slotWidth
				decided[slot]++
				if took >= time.Millisecond {
					waited[slot]++
				}
				if err != nil {
					errs++
					continue
				}
				if r.Allowed {
					bins[t0.Sub(start)/binWidth]++
					lastEnd = max(lastEnd, time.Now().UnixNano())
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for p := range h {
				rep.Hist[p].Merge(&h[p])
			}
			for i, n := range bins {
				rep.Bins[i] += n
			}
			for i := range decided {
				rep.Decided[i] += decided[i]
				rep.Waited[i] += waited[i]
			}
			rep.Errors += errs
			rep.LastEnd = max(rep.LastEnd, lastEnd)
		}()
	}
	wg.Wait()
	l.Close() // refunds that fail are counted lost; Stats tells
	rep.Opened, rep.FirstOK, rep.FirstLease, rep.Stats = opened.Load(), firstOK.Load(), firstLease.Load(), l.Stats()
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// TestFaultKillAndRestart is G4 and the kill bars: three processes with 16
// goroutines each on a hot key; Redis is SIGKILLed for 5 s, then started
// again empty. No caller sees an error; decisions wait at most the budget
// until the breaker opens and take microseconds after; each instance admits
// during the outage at most its fallback share plus the lease it held; and
// leasing resumes within one probe interval of Redis answering.
func TestFaultKillAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 9 s fleet")
	}
	s := redistest.Start(t)
	limit := tierlimit.PerSecond(300)
	budget, probe := 25*time.Millisecond, 500*time.Millisecond
	start := time.Now().Add(time.Second)
	killAt := start.Add(2 * time.Second)
	restartAt := killAt.Add(5 * time.Second)
	spec := memberSpec{
		Addr: s.Addr, Limit: limit, Keys: 1, Prefix: "g4:", Goroutines: 16, Duration: 9 * time.Second,
		Start: start.UnixNano(), Fault: true, KillAt: killAt.UnixNano(), RestartAt: restartAt.UnixNano(),
		Budget: budget, Probe: probe, Heartbeat: 200 * time.Millisecond,
	}
	var outs [][]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		outs = runMembers(t, 3, spec)
	}()
	time.Sleep(time.Until(killAt))
	s.Kill()
	killedAt := time.Now() // Redis is dead by then: on a loaded machine, a little after killAt
	time.Sleep(time.Until(restartAt))
	s.Restart(t)
	readyAt := time.Now()
	<-done
	if t.Failed() {
		return
	}
	var worst [phases]histogram.Histogram
	for i, out := range outs {
		var r faultReport
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		st := r.Stats
		if r.Errors != 0 {
			t.Errorf("member %d: %d errors reached callers, want 0", i, r.Errors)
		}
		if st.BreakerOpens == 0 || r.Opened == 0 {
			t.Errorf("member %d: the breaker never opened", i)
		}
		if st.Leased != st.Spent+st.Refunded+st.Lost+st.Held || st.Held != 0 {
			t.Errorf("member %d: ledger %+v does not balance", i, st)
		}
		// Admissions during the outage, from the kill until this member
		// saw Redis answer again (the test may see that a little later:
		// Restart returns after its own PING), against the instance's
		// fallback share over that time, plus the tokens it held at the
		// kill and one lease that a refill in flight may have added. The
		// outage begins when Redis was dead for sure: admissions between
		// the planned kill and the kill spent leases Redis granted (under
		// load, the kill came late enough for one more lease, and G4 was
		// missed by one token).
		back := readyAt
		if ok := time.Unix(0, r.FirstOK); r.FirstOK != 0 && ok.Before(back) {
			back = ok
		}
		outage := back.Sub(killedAt)
		var admitted int64
		for b, n := range r.Bins {
			at := start.Add(time.Duration(b) * binWidth)
			// Whole bins only: the one in which Redis came back may hold
			// spending of a fresh lease.
			if !at.Before(killedAt) && !at.Add(binWidth).After(back) {
				admitted += n
			}
		}
		share := r.Share
		lease := limit.Capacity() / hybrid.DefaultLeaseShare
		bound := share.Capacity() + int64(float64(share.Rate)*float64(outage)/float64(share.Period)) + r.HeldAtKill + lease
		t.Logf("member %d: outage %v (the kill %v after its time), admitted %d, bound %d (share %v, held %d at the kill, + one lease %d); breaker opened %v after the kill; %d lost; stats %+v",
			i, outage.Round(time.Millisecond), killedAt.Sub(killAt).Round(time.Microsecond), admitted, bound, share, r.HeldAtKill, lease,
			time.Duration(r.Opened-killAt.UnixNano()).Round(time.Microsecond), st.Lost, st)
		if share.Capacity() >= limit.Capacity() {
			t.Errorf("member %d: fallback share %v at the kill, want a third of %v (3 instances)", i, share, limit)
		}
		if admitted > bound {
			t.Errorf("member %d: admitted %d during the outage > bound %d", i, admitted, bound)
		}
		if admitted < bound/2 {
			t.Errorf("member %d: admitted %d during the outage, under half its share %d: the fallback is not deciding", i, admitted, bound)
		}
		// Leasing resumes within one probe interval of Redis answering
		// (plus the budget of a probe that failed just before).
		if r.FirstLease == 0 {
			t.Errorf("member %d: no lease claimed after Redis came back", i)
		}
		resumed := time.Duration(r.FirstLease - readyAt.UnixNano())
		t.Logf("member %d: first lease %v after Redis answered again (probe interval %v)", i, resumed.Round(time.Microsecond), probe)
		// Under the race detector, with three processes on two cores and
		// the rest of the suite beside them, the probe's own call (a
		// dial, the script) took up to 262 ms in a CI run: a second probe
		// interval of room.
		bar := probe + budget + 50*time.Millisecond
		if raceEnabled {
			bar += probe
		}
		if resumed > bar {
			t.Errorf("member %d: first lease %v after Redis answered, want within %v (the probe interval %v + budget + 50ms)", i, resumed, bar, probe)
		}
		for p := range worst {
			worst[p].Merge(&r.Hist[p])
		}
	}
	for p := range worst {
		t.Logf("phase %-8s: %8d decisions, p50 <= %v, p99 <= %v, p99.9 <= %v", phaseNames[p], worst[p].Count(),
			worst[p].Bound(0.5), worst[p].Bound(0.99), worst[p].Bound(0.999))
	}
	// Budgets: p99 within the call budget while the breaker is closed, and
	// microseconds once it is open. Both are timing bars on a shared
	// 2-core machine: the race detector gets room, and CI's figure is
	// logged above.
	// Under the race detector, with three processes on two cores, only
	// "no decision waits on Redis while the breaker is open" is asserted:
	// a p99 under one budget.
	slack, openBar := 5*time.Millisecond, 2*time.Microsecond
	if raceEnabled {
		slack, openBar = 50*time.Millisecond, budget
	}
	if p99 := worst[phaseFailing].Bound(0.99); p99 > budget+slack {
		t.Errorf("p99 before the breaker opened = %v, want <= budget %v (+%v)", p99, budget, slack)
	}
	if p99 := worst[phaseOpen].Bound(0.99); p99 > openBar {
		t.Errorf("p99 with the breaker open = %v, want <= %v", p99, openBar)
	}
}

// loadResult is what runLoad saw.
type loadResult struct {
	admitted map[string]int64
	errors   int64
	hist     histogram.Histogram // latencies of decisions started in the fault window
	maxG     int                 // most goroutines seen during the run
}

// runLoad calls l from 16 goroutines over keys k0..k(keys-1) for d,
// measuring the decisions that start between from and to after its start.
func runLoad(l *hybrid.Limiter, keys int, d, from, to time.Duration) loadResult {
	start := time.Now()
	res := loadResult{admitted: map[string]int64{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var maxG atomic.Int64
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				maxG.Store(max(maxG.Load(), int64(runtime.NumGoroutine())))
			}
		}
	}()
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 3))
			admitted := map[string]int64{}
			var h histogram.Histogram
			var errs int64
			for {
				t0 := time.Now()
				since := t0.Sub(start)
				if since >= d {
					break
				}
				key := "k" + strconv.Itoa(rng.IntN(keys))
				r, err := l.Allow(context.Background(), key)
				if since >= from && since < to {
					h.Add(time.Since(t0))
				}
				if err != nil {
					errs++
				} else if r.Allowed {
					admitted[key]++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for k, n := range admitted {
				res.admitted[k] += n
			}
			res.hist.Merge(&h)
			res.errors += errs
		}(uint64(g))
	}
	wg.Wait()
	close(stop)
	res.maxG = int(maxG.Load())
	return res
}

// settleGoroutines waits up to 5 s for the goroutine count to come back to
// base and returns it.
func settleGoroutines(base int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

// TestFaultSlowRedis: Redis stopped (SIGSTOP) or busy (DEBUG SLEEP) for 2 s
// under load. No error reaches a caller, p99 decision time stays within the
// budget + 1 ms, and the goroutines do not pile up: their count is bounded
// during the fault and back to its baseline after Close.
func TestFaultSlowRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 4 s of load per fault")
	}
	faults := []struct {
		name  string
		apply func(t *testing.T, s *redistest.Server) (undo func())
	}{
		{"paused", func(t *testing.T, s *redistest.Server) func() {
			s.Pause()
			return s.Resume
		}},
		{"debug sleep", func(t *testing.T, s *redistest.Server) func() {
			admin := s.Client(t)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					// Each DEBUG SLEEP blocks the whole server for 200 ms.
					admin.Do(context.Background(), "DEBUG", "SLEEP", "0.2")
				}
			}()
			return func() { close(stop); <-done }
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t, "--enable-debug-command", "yes")
			base := runtime.NumGoroutine()
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 32, ContextTimeoutEnabled: true})
			budget := 25 * time.Millisecond
			l, err := hybrid.New(rdb, tierlimit.PerSecond(500), hybrid.WithCallBudget(budget),
				hybrid.WithProbeInterval(200*time.Millisecond), hybrid.WithLeaseTTL(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			applied := make(chan func(), 1) // the fault's undo, from the timer's goroutine
			timer := time.AfterFunc(time.Second, func() { applied <- f.apply(t, s) })
			res := runLoad(l, 50, 4*time.Second, time.Second, 3*time.Second)
			if timer.Stop() {
				t.Fatal("the load ended before the fault began")
			}
			// The fault lasted [1 s, 3 s); end it if the load outran it.
			(<-applied)()
			st := l.Stats()
			l.Close()
			rdb.Close()
			after := settleGoroutines(base)
			p99 := res.hist.Bound(0.99)
			t.Logf("%d decisions in the fault: p50 <= %v, p99 <= %v, max %d goroutines (base %d, %d after Close); stats %+v",
				res.hist.Count(), res.hist.Bound(0.5), p99, res.maxG, base, after, st)
			if res.errors != 0 {
				t.Errorf("%d errors reached callers, want 0", res.errors)
			}
			slack := time.Millisecond
			if raceEnabled {
				slack = 50 * time.Millisecond
			}
			if p99 > budget+slack {
				t.Errorf("p99 in the fault = %v, want <= budget %v + %v", p99, budget, slack)
			}
			if st.Fallback == 0 || st.BreakerOpens == 0 {
				t.Errorf("no fallback decision or no breaker opening during the fault: %+v", st)
			}
			// 16 callers, the limiter's own goroutines, a flight per key and
			// the client's connections: bounded whatever the fault's length.
			if limit := base + 16 + 8 + 50 + 2*32 + 16; res.maxG > limit {
				t.Errorf("%d goroutines during the fault, want <= %d: they pile up", res.maxG, limit)
			}
			if after > base {
				t.Errorf("%d goroutines after Close, %d before", after, base)
			}
		})
	}
}

// TestFaultFlush: SCRIPT FLUSH and FLUSHALL every 100 ms under load. No
// caller error; after SCRIPT FLUSH no call fails with NOSCRIPT, the
// fallback decides only while the breaker is open (for slowness), and Redis holds at most capacity - admitted -
// Stats.Lost for the keys (nothing minted), and less only by what failed
// calls' lost replies stranded; after FLUSHALL, which forgets the
// buckets, the ledger still balances.
func TestFaultFlush(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 1.5 s of load per fault")
	}
	for _, cmd := range [][]any{{"SCRIPT", "FLUSH"}, {"FLUSHALL"}} {
		name := strings.TrimSpace(fmt.Sprintln(cmd...))
		t.Run(name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := s.Client(t)
			admin := s.Client(t)
			// Refills one token an hour: Redis's level tells exactly what
			// was debited (under -race no key runs dry; a fast machine
			// without it may drain them, and the check then says little).
			limit := tierlimit.Limit{Rate: 1, Period: time.Hour, Burst: 500_000}
			// Default options (the lease TTL aside: many expiries) and
			// go-redis's default client: on a loaded machine some calls run
			// past the budget, and some of those return an error (a context
			// deadline) after Redis ran them.
			// The lease ledger hands such a claim's grant over at the key's
			// next claim, or takes it back at its refund (store.Claim's
			// Received): none is stranded.
			// A claim over the budget is a denial (Source fallback), never
			// an admission the fallback made.
			// The fallback may decide only while the breaker is open for
			// slowness (calls past their budget or the client's read
			// timeout on a loaded machine, as CI under -race and a run
			// beside a busy loop saw), never because of NOSCRIPT.
			var noScript, fellBack, otherErrs atomic.Int64
			obs := &tierlimit.Observer{
				RedisCall: func(c tierlimit.RedisCall) {
					switch {
					case c.Err == nil || errors.Is(c.Err, context.DeadlineExceeded) || errors.Is(c.Err, os.ErrDeadlineExceeded):
						// slowness: the call budget, or the client's read timeout
					case strings.Contains(c.Err.Error(), "NOSCRIPT"):
						noScript.Add(1)
					default:
						otherErrs.Add(1)
						t.Logf("call %s: %v", c.Op, c.Err)
					}
				},
				Decision: func(d tierlimit.Decision) {
					if d.Source == tierlimit.SourceFallback && d.Allowed {
						fellBack.Add(1)
					}
				},
			}
			l, err := hybrid.New(rdb, limit, hybrid.WithLeaseTTL(100*time.Millisecond), hybrid.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			flushed := make(chan int)
			go func() {
				n := 0
				defer func() { flushed <- n }()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if err := admin.Do(context.Background(), cmd...).Err(); err != nil {
							t.Errorf("%s: %v", name, err)
						}
						n++
					}
				}
			}()
			res := runLoad(l, 20, 1500*time.Millisecond, 0, 0)
			close(stop)
			n := <-flushed
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			st := l.Stats()
			var admitted int64
			for _, v := range res.admitted {
				admitted += v
			}
			t.Logf("%d flushes, %d admitted; stats %+v", n, admitted, st)
			if res.errors != 0 {
				t.Errorf("%d errors reached callers, want 0", res.errors)
			}
			if st.Leased != st.Spent+st.Refunded+st.Lost+st.Held || st.Spent != admitted || st.Held != 0 {
				t.Errorf("ledger %+v, admitted %d: does not balance", st, admitted)
			}
			if name != "SCRIPT FLUSH" {
				return
			}
			if noScript.Load() != 0 || otherErrs.Load() != 0 {
				t.Errorf("SCRIPT FLUSH: %d calls failed with NOSCRIPT and %d with another error than their budget; want 0, 0 (NOSCRIPT is absorbed)",
					noScript.Load(), otherErrs.Load())
			}
			if fellBack.Load() != 0 && st.BreakerOpens == 0 {
				t.Errorf("SCRIPT FLUSH: the fallback admitted %d with the breaker never open", fellBack.Load())
			}
			// Nothing minted: Redis holds at most capacity - admitted - what
			// Stats counts lost (a janitor's refund that a loaded machine
			// sends past its record's deadline gives none back, the ledger's
			// L2, and is counted so). What a claim's lost reply granted is
			// handed over by the holder's next claim or refund while its
			// record lives; past it, it is stranded, unseen by Stats, until
			// the bucket refills (bounded below).
			var held, want int64
			for k, level := range levels(t, admin, limit, res.admitted) {
				held += level
				want += limit.Capacity() - res.admitted[k]
			}
			want -= st.Lost
			// Stranded: what replies that never arrived granted, taken
			// back by no refund inside its record's life (Stats cannot
			// count a grant it never heard of). None without a failed
			// call; at most a lease per key per failed call (a refill
			// claims for many keys in one). A fixed 1% of what was leased
			// failed CI under -race: 208,690 of 2.2M after 3 failed calls.
			maxLease := limit.Capacity() / hybrid.DefaultLeaseShare
			strandable := st.RedisErrors * int64(len(res.admitted)) * maxLease
			t.Logf("Redis holds %d for the keys; capacity - admitted - lost = %d (%d stranded, at most %d)", held, want, want-held, strandable)
			if held > want || want-held > strandable {
				t.Errorf("Redis holds %d for the keys after %d admitted, want at most %d (capacity - admitted - %d lost) and at least %d (a lease per key stranded by each of %d failed calls)",
					held, admitted, want, st.Lost, want-strandable, st.RedisErrors)
			}
		})
	}
}

// TestFaultConnectionResets: half the connections to Redis are reset
// mid-flight by a proxy, while leases expire and are refunded every 50 ms.
// go-redis resends a command whose connection broke, so a refund may reach
// Redis twice: refunds are idempotent, and Redis never holds more tokens
// than capacity - admitted (no token minted). The ledger balances.
func TestFaultConnectionResets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of load")
	}
	s := redistest.Start(t)
	proxy := redistest.StartProxy(t, s.Addr)
	proxy.ResetConnections(0.5, 20*time.Millisecond)
	// Connections are replaced every 20 ms, so that half the new ones keep
	// being reset.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 16, ContextTimeoutEnabled: true,
		ConnMaxLifetime: 20 * time.Millisecond})
	defer rdb.Close()
	limit := tierlimit.Limit{Rate: 3600, Period: time.Hour, Burst: 100_000_000}
	// The default budget: a claim go-redis resends past it is denied
	// (the breaker, which needs 1000 failures here, stays closed), never
	// decided by a fallback, so Redis's level can be checked per key.
	l, err := hybrid.New(rdb, limit, hybrid.WithLeaseTTL(50*time.Millisecond), hybrid.WithBreakerThreshold(1000))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	res := runLoad(l, 20, 2*time.Second, 0, 0)
	l.Close()
	// The bucket refills a token a second: the level may be that much
	// above capacity - admitted.
	refill := int64(time.Since(began)/time.Second) + 2
	st := l.Stats()
	var admitted int64
	for _, v := range res.admitted {
		admitted += v
	}
	t.Logf("%d connections reset; %d admitted; stats %+v", proxy.Resets(), admitted, st)
	if proxy.Resets() < 10 {
		t.Fatalf("only %d connections reset: the fault did not happen", proxy.Resets())
	}
	if res.errors != 0 {
		t.Errorf("%d errors reached callers, want 0", res.errors)
	}
	if st.BreakerOpens != 0 {
		t.Fatalf("the breaker opened %d times: fallbacks may have admitted, and Redis's level per key no longer tells minted tokens", st.BreakerOpens)
	}
	if st.Leased != st.Spent+st.Refunded+st.Lost+st.Held || st.Spent != admitted || st.Held != 0 {
		t.Errorf("ledger %+v, admitted %d: does not balance", st, admitted)
	}
	var unaccounted int64
	for k, level := range levels(t, s.Client(t), limit, res.admitted) {
		if v, most := res.admitted[k], limit.Capacity()-res.admitted[k]+refill; level > most {
			t.Errorf("key %s: Redis holds %d after %d admitted: %d tokens minted", k, level, v, level-most)
		} else {
			unaccounted += most - level
		}
	}
	t.Logf("tokens debited in Redis but neither spent nor refunded: %d (lost %d, the rest in calls whose reply was cut)", unaccounted, st.Lost)
	// A cut reply strands no tokens when the claim's next call, or its
	// resend, hands them over (Claim.Received, Claim.Gen): what is left is
	// grants whose record passed its deadline first (75 ms here), which
	// on a loaded machine is most of them (figures in docs/design.md).
	// testLeaseLedgerOrphan pins each case; this bound catches a gross
	// regression only. Stranded tokens are an under-admission, never a
	// mint (checked above); since the cumulative-counter protocol a
	// refund past its record's deadline gives nothing back (V4), and CI
	// under -race saw 10.9% stranded.
	if stranded := unaccounted - st.Lost; stranded > st.Leased/5 {
		t.Errorf("%d tokens stranded in calls whose reply was cut, more than 20%% of the %d leased", stranded, st.Leased)
	}
}

// levels reads, through a peek of the token bucket hybrid leases from,
// the tokens Redis holds for each key of admitted under limit.
func levels(t *testing.T, rdb redis.UniversalClient, limit tierlimit.Limit, admitted map[string]int64) map[string]int64 {
	t.Helper()
	check, err := remote.NewTokenBucket(rdb, limit)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(admitted))
	for k := range admitted {
		r, err := check.AllowN(context.Background(), k, 0)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = r.Remaining
	}
	return out
}

// TestSoak runs a limiter under load while Redis is killed every 20 s and
// restarted 2 s later, for TIERLIMIT_SOAK (a duration, at most 15m; the test
// is skipped without it; .ci/soak runs 60s). No error reaches a caller, the
// live heap measured before each kill stays within 10% of the first, and
// Close leaves no goroutine behind.
func TestSoak(t *testing.T) {
	env := os.Getenv("TIERLIMIT_SOAK")
	if env == "" {
		t.Skip("set TIERLIMIT_SOAK=10m (or 60s) to run the soak test")
	}
	d, err := time.ParseDuration(env)
	if err != nil || d < 60*time.Second || d > 15*time.Minute {
		t.Fatalf("TIERLIMIT_SOAK=%q: want a duration between 60s and 15m", env)
	}
	s := redistest.Start(t)
	base := runtime.NumGoroutine()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 16, ContextTimeoutEnabled: true})
	l, err := hybrid.New(rdb, tierlimit.PerSecond(1000), hybrid.WithMaxKeys(2000),
		hybrid.WithProbeInterval(200*time.Millisecond), hybrid.WithLeaseTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan loadResult)
	go func() { done <- runLoad(l, 5000, d, 0, d) }()
	began := time.Now()
	// The live heap is sampled 3 s before each 20 s mark; Redis is killed
	// at each mark but the last.
	var heaps []uint64
	for mark := 20 * time.Second; mark <= d; mark += 20 * time.Second {
		time.Sleep(time.Until(began.Add(mark - 3*time.Second)))
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		heaps = append(heaps, m.HeapAlloc)
		st := l.Stats()
		t.Logf("%v: live heap %d KiB, %d goroutines; breaker opened %d times, %d fallback decisions, %d lost",
			mark-3*time.Second, m.HeapAlloc>>10, runtime.NumGoroutine(), st.BreakerOpens, st.Fallback, st.Lost)
		if mark+20*time.Second > d {
			break
		}
		time.Sleep(time.Until(began.Add(mark)))
		s.Kill()
		time.Sleep(2 * time.Second)
		s.Restart(t)
	}
	res := <-done
	st := l.Stats()
	if err := l.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	rdb.Close()
	after := settleGoroutines(base)
	t.Logf("%d decisions; decision p99 <= %v; stats %+v", res.hist.Count(), res.hist.Bound(0.99), st)
	if res.errors != 0 {
		t.Errorf("%d errors reached callers, want 0", res.errors)
	}
	if st.Leased != st.Spent+st.Refunded+st.Lost+st.Held {
		t.Errorf("ledger %+v does not balance", st)
	}
	if after > base {
		t.Errorf("%d goroutines after Close, %d before", after, base)
	}
	// The first window warms the caches up: the second sample, after a
	// whole kill cycle, is the baseline.
	if len(heaps) < 3 {
		t.Fatalf("only %d heap samples: the soak is too short", len(heaps))
	}
	for i, h := range heaps[2:] {
		if float64(h) > 1.1*float64(heaps[1]) {
			t.Errorf("live heap at sample %d: %d KiB, more than 10%% above the baseline, %d KiB", i+3, h>>10, heaps[1]>>10)
		}
	}
}

// keySlot is the Cluster slot of every Redis key of a user key: the slot of
// the library's hash tag (16 hex digits of xxHash64, see docs/operations.md).
func keySlot(t *testing.T, rdb *redis.ClusterClient, key string) int {
	t.Helper()
	tag := fmt.Sprintf("{%016x}", xxhash.Sum64String(key))
	slot, err := rdb.ClusterKeySlot(context.Background(), tag).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(slot)
}

// TestFaultCluster: on a 3-master Redis Cluster under load, the slot of a
// loaded key is migrated to another master (ASK, then MOVED), and a master
// fails over to its replica (MOVED, READONLY from the demoted master).
// Callers see no error, no call ever gets CROSSSLOT, the ledger balances
// and no token is minted.
func TestFaultCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 5 s of load on a cluster")
	}
	c := redistest.StartCluster(t)
	rdb := c.Client(t)
	var calls, failed, crossSlot atomic.Int64
	obs := &tierlimit.Observer{RedisCall: func(rc tierlimit.RedisCall) {
		calls.Add(1)
		if rc.Err != nil {
			failed.Add(1)
			if strings.Contains(rc.Err.Error(), "CROSSSLOT") {
				crossSlot.Add(1)
			}
		}
	}}
	limit := tierlimit.Limit{Rate: 3600, Period: time.Hour, Burst: 100_000_000}
	l, err := hybrid.New(rdb, limit, hybrid.WithLeaseTTL(100*time.Millisecond), hybrid.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	migrated := keySlot(t, rdb, "k0")
	from := c.SlotOwner(t, migrated)
	to := (from + 1) % len(c.Nodes)
	failing := c.SlotOwner(t, keySlot(t, rdb, "k1"))
	replica := c.AddReplica(t, failing)

	began := time.Now()
	done := make(chan loadResult)
	go func() { done <- runLoad(l, 20, 5*time.Second, 0, 5*time.Second) }()
	time.Sleep(time.Second)
	c.MigrateSlot(t, migrated, from, to)
	t.Logf("slot %d of k0 migrated from node %d to node %d at %v", migrated, from, to, time.Since(began).Round(time.Millisecond))
	time.Sleep(time.Second)
	c.Failover(t, replica)
	t.Logf("node %d failed over to its replica %s at %v", failing, replica.Addr, time.Since(began).Round(time.Millisecond))
	res := <-done
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	refill := int64(time.Since(began)/time.Second) + 2
	st := l.Stats()
	var admitted int64
	for _, v := range res.admitted {
		admitted += v
	}
	t.Logf("%d admitted; %d Redis calls, %d failed, %d CROSSSLOT; p99 <= %v; stats %+v",
		admitted, calls.Load(), failed.Load(), crossSlot.Load(), res.hist.Bound(0.99), st)
	if res.errors != 0 {
		t.Errorf("%d errors reached callers, want 0", res.errors)
	}
	if crossSlot.Load() != 0 {
		t.Errorf("%d calls got CROSSSLOT, want none ever", crossSlot.Load())
	}
	if st.Leased != st.Spent+st.Refunded+st.Lost+st.Held || st.Held != 0 {
		t.Errorf("ledger %+v does not balance", st)
	}
	if st.Fallback != 0 {
		t.Logf("%d decisions fell back during the resharding: the level check below counts them as leased", st.Fallback)
	}
	for k, level := range levels(t, rdb, limit, res.admitted) {
		if v := res.admitted[k]; level > limit.Capacity()-v+st.Fallback+refill {
			t.Errorf("key %s: Redis holds %d after %d admitted: tokens minted", k, level, v)
		}
	}
}

// TestOutageKeepingState is G1 and G4 across outages where Redis keeps its
// state: CLIENT PAUSE WRITE, SIGSTOP, and SIGKILL with a restart from the
// append-only file, each for 3 s, under three processes of 16 goroutines on
// a saturated hot key, with default options and go-redis's default client.
// Over the run the fleet admits at most 5% over one bucket (the fallback
// starts from what the key had, and what it admitted is charged back); no
// caller gets an error; and from 500 ms into the fault, decisions are made
// locally (fewer than 5% of each 250 ms slot's wait a millisecond).
func TestOutageKeepingState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three 7 s fleets")
	}
	const fault = 3 * time.Second
	writePause := func(t *testing.T, s *redistest.Server) func() {
		err := s.Client(t).Do(context.Background(), "CLIENT", "PAUSE", fault.Milliseconds(), "WRITE").Err()
		if err != nil {
			t.Error(err)
		}
		return func() {} // the pause ends by itself
	}
	faults := []struct {
		name       string
		args       []string
		limit      tierlimit.Limit
		goroutines int
		floor      float64 // the least the fleet admits, of one bucket over the run (0: not checked)
		begin      func(t *testing.T, s *redistest.Server) (end func())
	}{
		{"client pause", nil, tierlimit.PerSecond(300), 16, 0, writePause},
		// A fast limit that few callers saturate. The claims in flight
		// when the pause began run first when it ends and may lower
		// their records below what the bucket refilled to, so that no
		// charge finds it full: the fleet's debts are then carried for
		// the debt window (a second of the rate), and the breaker's
		// opening costs about a quarter second of it (docs/design.md,
		// G4, "Charged back"): over 7 s, 1 - 2500/16000 = 0.84 of one
		// bucket, less what a loaded machine's scheduling costs the
		// callers (0.8: debts carried for the whole lease TTL gave 0.78).
		{"client pause, 2000/s", nil, tierlimit.PerSecond(2000), 4, 0.8, writePause},
		{"sigstop", nil, tierlimit.PerSecond(300), 16, 0, func(t *testing.T, s *redistest.Server) func() {
			s.Pause()
			return s.Resume
		}},
		{"sigkill with aof", []string{"--appendonly", "yes", "--appendfsync", "always"}, tierlimit.PerSecond(300), 16, 0, func(t *testing.T, s *redistest.Server) func() {
			s.Kill()
			return func() { s.RestartKeeping(t) }
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			s := redistest.Start(t, f.args...)
			limit := f.limit
			start := time.Now().Add(time.Second)
			faultAt := start.Add(2 * time.Second)
			endAt := faultAt.Add(fault)
			spec := memberSpec{
				Addr: s.Addr, Limit: limit, Keys: 1, Prefix: "keep:", Goroutines: f.goroutines, Duration: 7 * time.Second,
				Start: start.UnixNano(), Fault: true, KillAt: faultAt.UnixNano(), RestartAt: endAt.UnixNano(), Defaults: true,
			}
			var outs [][]byte
			done := make(chan struct{})
			go func() {
				defer close(done)
				outs = runMembers(t, 3, spec)
			}()
			time.Sleep(time.Until(faultAt))
			end := f.begin(t, s)
			time.Sleep(time.Until(endAt))
			end()
			<-done
			if t.Failed() {
				return
			}
			var admitted, opens, fellBack, charged int64
			perSlot := make([]int64, spec.Duration/slotWidth+1) // admissions per slot, every member
			var last time.Time
			decided := make([]int64, spec.Duration/slotWidth+1)
			waited := make([]int64, len(decided))
			for i, out := range outs {
				var r faultReport
				if err := json.Unmarshal(out, &r); err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
				if r.Errors != 0 {
					t.Errorf("member %d: %d errors reached callers, want 0", i, r.Errors)
				}
				for j, n := range r.Bins {
					admitted += n
					if k := j * int(binWidth) / int(slotWidth); k < len(perSlot) {
						perSlot[k] += n
					}
				}
				for j := range decided {
					decided[j] += r.Decided[j]
					waited[j] += r.Waited[j]
				}
				if end := time.Unix(0, r.LastEnd); end.After(last) {
					last = end
				}
				opens += r.Stats.BreakerOpens
				fellBack += r.Stats.Fallback
				charged += r.Stats.ChargedBack
			}
			bound := bucketBound(limit, start, last)
			t.Logf("%d admitted, %.3f× one bucket over the run (%d); %d breaker openings, %d fallback decisions, %d tokens charged back",
				admitted, float64(admitted)/float64(bound), bound, opens, fellBack, charged)
			if float64(admitted) > 1.05*float64(bound) {
				t.Errorf("G1: the fleet admitted %d, over 1.05× one bucket's %d across the outage", admitted, bound)
			}
			if float64(admitted) < f.floor*float64(bound) {
				t.Errorf("the fleet admitted %d, under %.2f× one bucket's %d across the outage", admitted, f.floor, bound)
			}
			var slots []string
			for j := range decided {
				at := start.Add(time.Duration(j) * slotWidth)
				if at.Before(faultAt) || !at.Add(slotWidth).Before(endAt) {
					continue
				}
				perSec := decided[j] * int64(time.Second/slotWidth)
				slots = append(slots, fmt.Sprintf("%v: %d/s, %d waited", at.Sub(faultAt), perSec, waited[j]))
				if at.Sub(faultAt) >= 500*time.Millisecond && (decided[j] == 0 || waited[j]*20 > decided[j]) {
					t.Errorf("G4: %v into the fault, %d of %d decisions waited a millisecond or more, want under 5%%",
						at.Sub(faultAt), waited[j], decided[j])
				}
			}
			t.Logf("decisions inside the fault, per 250 ms slot: %s", strings.Join(slots, "; "))
			t.Logf("admissions per %v from the start (the fault from slot %d to %d): %v", slotWidth, faultAt.Sub(start)/slotWidth, endAt.Sub(start)/slotWidth, perSlot)
		})
	}
}

// TestRecoveryOverManyKeys: after a stall in which the fallback admitted
// on many keys, with default options and go-redis's default client beside
// a busy loop, the limiter recovers by itself while its caller goes on:
// once its breaker has closed after Redis returned, it does not open
// again, and every token the fallback admitted is charged back to Redis.
// What the fallback admitted while a charge of its key was in flight (a
// claim over its budget falls back) was forgiven a second later, as if
// the bucket had lacked it: 384 to 576 tokens of 2.6 to 3.5 million in
// three runs.
func TestRecoveryOverManyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis for 3 s")
	}
	const keys = 5000
	s := redistest.Start(t)
	rdb := defaultClient(t, s)
	var fellBack atomic.Int64
	obs := &tierlimit.Observer{Decision: func(d tierlimit.Decision) {
		if d.Source == tierlimit.SourceFallback && d.Allowed {
			fellBack.Add(d.N)
		}
	}}
	// Buckets far from empty whatever the fallback admits in the test's
	// seconds: every debt is paid in full at its first charge, none is
	// forgiven.
	lim, err := hybrid.New(rdb, tierlimit.PerHour(10_000_000), hybrid.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	pass := func() {
		for i := range keys {
			if _, err := lim.AllowN(ctx, "k"+strconv.Itoa(i), 1); err != nil {
				t.Fatalf("AllowN = %v", err)
			}
		}
	}
	pass()
	stop := busyLoop(true)
	defer stop()

	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	// The leases expire, the breaker opens, the fallback decides.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		pass()
	}
	s.Resume()
	resumed = true
	owed := fellBack.Load()
	if owed < keys/2 {
		t.Fatalf("the fallback admitted %d in the stall, want at least %d: the test's stall did not reach the keys", owed, keys/2)
	}

	// Callers go on for 3 s: the breaker closes within a probe interval
	// and stays closed.
	var closedOpens int64 = -1
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		pass()
		if st := lim.Stats(); closedOpens < 0 && st.Breaker == tierlimit.BreakerClosed {
			closedOpens = st.BreakerOpens
		}
	}
	// Every admission of the fallback is charged within a few janitor
	// rounds (a quarter lease TTL each).
	var st hybrid.Stats
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if st = lim.Stats(); st.ChargedBack >= fellBack.Load() {
			break
		}
	}
	t.Logf("the fallback admitted %d in the stall, %d in all; %d charged back; breaker opened %d times (%d when it first closed after the stall)",
		owed, fellBack.Load(), st.ChargedBack, st.BreakerOpens, closedOpens)
	if closedOpens < 0 {
		t.Fatalf("the breaker did not close within 3 s of Redis returning: %+v", st)
	}
	if st.BreakerOpens != closedOpens {
		t.Errorf("the breaker opened %d more times after it closed, with Redis answering; want none", st.BreakerOpens-closedOpens)
	}
	if st.ChargedBack != fellBack.Load() {
		t.Errorf("charged back %d of the %d tokens the fallback admitted, want all", st.ChargedBack, fellBack.Load())
	}
}

// TestRecoveryBreakerStaysClosed: after a 2 s stall under a loop over
// 10,000 keys of 1000/s each, with default options and go-redis's default
// client beside a busy loop, the breaker, once closed after Redis
// returned, stays closed while the janitor charges back what the fallback
// admitted on the keys. A charge of every key in one call kept Redis busy
// past the call budget, which the breaker takes for a stall: at 2fdc797 it
// opened again about 0.4 s after closing.
func TestRecoveryBreakerStaysClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls Redis for 2 s")
	}
	const keys = 10_000
	s := redistest.Start(t)
	lim, err := hybrid.New(defaultClient(t, s), tierlimit.PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	i := 0
	// run asks the keys in turn, 100 at a time, for d, and calls each
	// after every 100.
	run := func(d time.Duration, each func()) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			for range 100 {
				i++
				if _, err := lim.Allow(ctx, "k"+strconv.Itoa(i%keys)); err != nil {
					t.Fatalf("Allow = %v", err)
				}
			}
			time.Sleep(time.Millisecond)
			each()
		}
	}
	stop := busyLoop(true)
	defer stop()
	run(2*time.Second, func() {})
	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	run(2*time.Second, func() {})
	s.Resume()
	resumed = true
	var closedOpens int64 = -1
	run(3*time.Second, func() {
		if st := lim.Stats(); closedOpens < 0 && st.Breaker == tierlimit.BreakerClosed {
			closedOpens = st.BreakerOpens
		}
	})
	st := lim.Stats()
	t.Logf("breaker opened %d times (%d when it first closed after the stall); %d fallback decisions, %d tokens charged back",
		st.BreakerOpens, closedOpens, st.Fallback, st.ChargedBack)
	switch {
	case closedOpens < 0:
		t.Errorf("the breaker did not close within 3 s of Redis returning: %+v", st)
	case st.BreakerOpens != closedOpens:
		t.Errorf("the breaker opened %d more times after it closed, with Redis answering; want none", st.BreakerOpens-closedOpens)
	}
}
