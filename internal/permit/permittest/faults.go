package permittest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/canary"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// The fault table: 3 members × 32 goroutines hold permits of one key for
// 1-50 ms each, N = 5, TTL 1 s, go-redis's default client, while the test
// does one fault to a real redis-server (or to a member). In flight is
// counted from the callers' own timestamps (the wall clock, which the
// processes of one machine share): a permit is in flight from Acquire's
// return to just before its Release.

// timedReport is what a timed member prints: each permit's time in
// flight, in unix ns, and the errors of its Acquire calls.
type timedReport struct {
	Spans  [][2]int64
	Errors int64
}

// runTimed runs 32 goroutines on c, key "k", until d has passed.
func runTimed(c Limiter, d time.Duration) timedReport {
	var rep timedReport
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 32 {
		wg.Go(func() {
			for time.Now().Before(end) {
				deadline := time.Now().Add(200 * time.Millisecond)
				if deadline.After(end) {
					deadline = end
				}
				ctx, cancel := context.WithDeadline(context.Background(), deadline)
				p, err := c.Acquire(ctx, "k")
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						rep.Errors++
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				from := time.Now().UnixNano()
				time.Sleep(time.Duration(1+rand.N(50)) * time.Millisecond)
				to := time.Now().UnixNano()
				p.Release()
				mu.Lock()
				rep.Spans = append(rep.Spans, [2]int64{from, to})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return rep
}

// A Fault is one row of the fault table.
type Fault struct {
	Name string
	// Do does the fault, at about a second into the load; stop stops
	// member 0 with SIGSTOP.
	Do func(t *testing.T, srv *redistest.Server, member *exec.Cmd)
	// Lost: Redis loses the permits' state; the excess bound applies.
	Lost bool
	// Stops: member 0 is stopped; its permits in flight when it stopped
	// are out of the count (they outlive their TTL: design C2).
	Stops bool
}

// Faults are the rows of the fault table: none, FLUSHALL, a restart from
// empty, CLIENT PAUSE and DEBUG SLEEP longer than the TTL, and a member
// stopped longer than the TTL.
var Faults = []Fault{
	{Name: "none", Do: func(*testing.T, *redistest.Server, *exec.Cmd) {}},
	{Name: "flushall", Lost: true, Do: func(t *testing.T, srv *redistest.Server, _ *exec.Cmd) {
		srv.Client(t).FlushAll(context.Background())
	}},
	{Name: "restart", Lost: true, Do: func(t *testing.T, srv *redistest.Server, _ *exec.Cmd) {
		srv.Restart(t)
	}},
	{Name: "pause", Do: func(t *testing.T, srv *redistest.Server, _ *exec.Cmd) {
		srv.Client(t).Do(context.Background(), "CLIENT", "PAUSE", 2000, "ALL")
		time.Sleep(2 * time.Second)
	}},
	{Name: "sleep", Do: func(t *testing.T, srv *redistest.Server, _ *exec.Cmd) {
		srv.Client(t).Do(context.Background(), "DEBUG", "SLEEP", 2)
	}},
	{Name: "sigstop", Stops: true, Do: func(t *testing.T, _ *redistest.Server, m *exec.Cmd) {
		m.Process.Signal(syscall.SIGSTOP)
		time.Sleep(2 * time.Second)
		m.Process.Signal(syscall.SIGCONT)
	}},
}

// FaultResult is what a row measured.
type FaultResult struct {
	Max      int           // the most permits in flight at once
	Over     time.Duration // the time more than N were in flight
	Acquired int
	Errors   int64
}

// RunFault runs one row of the fault table on tier: 3 members of N = 5,
// TTL 1 s, for 5 s, the fault a second in.
func RunFault(t *testing.T, f Fault) FaultResult {
	t.Helper()
	const n, ttl, d = 5, time.Second, 5 * time.Second
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	spec := memberSpec{Addr: srv.Addr, N: n, TTL: ttl, Duration: d, Times: true}
	members := make([]*exec.Cmd, 3)
	outs := make([]*bufio.Scanner, 3)
	for i := range members {
		members[i] = startMember(t, spec)
		out, _ := members[i].StdoutPipe()
		if err := members[i].Start(); err != nil {
			t.Fatal(err)
		}
		defer members[i].Process.Kill()
		outs[i] = bufio.NewScanner(out)
		outs[i].Buffer(nil, 64<<20)
	}
	for i, sc := range outs {
		for sc.Scan() && sc.Text() != "ready" {
		}
		if sc.Text() != "ready" {
			t.Fatalf("member %d said %q, want ready", i, sc.Text())
		}
	}
	time.Sleep(time.Second)
	var stopAt int64
	if f.Stops {
		stopAt = time.Now().UnixNano()
	}
	f.Do(t, srv, members[0])
	var res FaultResult
	var events []event
	for i, sc := range outs {
		var rep timedReport
		for sc.Scan() {
			if json.Unmarshal(sc.Bytes(), &rep) == nil {
				break
			}
		}
		members[i].Wait()
		res.Errors += rep.Errors
		for _, s := range rep.Spans {
			if i == 0 && f.Stops && s[0] < stopAt && s[1] > stopAt {
				continue // in flight when its process stopped: C2
			}
			res.Acquired++
			events = append(events, event{s[0], 1}, event{s[1], -1})
		}
	}
	res.Max, res.Over = sweep(events, n)
	return res
}

type event struct {
	at int64
	d  int
}

// sweep returns the most spans open at once and the time more than n were.
func sweep(es []event, n int) (most int, over time.Duration) {
	slices.SortFunc(es, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.d - b.d // an end before a start at the same instant
	})
	in := 0
	for i, e := range es {
		if in > n && i > 0 {
			over += time.Duration(e.at - es[i-1].at)
		}
		in += e.d
		most = max(most, in)
	}
	return most, over
}

// FaultTable runs the fault table on the tier of the calling package's
// TestPermitMember: the short table (FLUSHALL, CLIENT PAUSE) unless
// TIERLIMIT_PERMIT_FAULTS is "full". No row may have more than N in
// flight, but those that lose Redis's state: they may have up to 2N, for
// at most a renewal interval (a third of the TTL) and the scheduling delay
// the test measures.
func FaultTable(t *testing.T) {
	rows := []string{"flushall", "pause"}
	if os.Getenv("TIERLIMIT_PERMIT_FAULTS") == "full" {
		rows = nil
		for _, f := range Faults {
			rows = append(rows, f.Name)
		}
	}
	for _, f := range Faults {
		if !slices.Contains(rows, f.Name) {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			can := canary.Start()
			defer can.Stop()
			r := RunFault(t, f)
			t.Logf("%s: max in flight %d, above N for %v, %d acquisitions, %d Acquire errors, scheduling delay %v",
				f.Name, r.Max, r.Over, r.Acquired, r.Errors, can.Worst())
			if r.Acquired == 0 {
				t.Errorf("no acquisition")
			}
			switch bound := time.Second/3 + can.Worst(); {
			case !f.Lost && r.Max > 5:
				t.Errorf("%d in flight, want at most N = 5", r.Max)
			case f.Lost && (r.Max > 10 || r.Over > bound):
				t.Errorf("%d in flight, above N for %v; want at most 2N = 10, for at most %v", r.Max, r.Over, bound)
			}
		})
	}
}
