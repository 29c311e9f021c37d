package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit"
)

const demoSynopsis = `
Usage: tierlimit demo [-duration 12s] [-plot FILE.png] [-redis URL]

Runs a simulated fleet: per strategy (local, remote-tb, remote-gcra, hybrid)
3 limiter instances, each with its own Redis client, share a limit of
1000/s on one hot key. First each strategy runs alone, as fast as it can,
and a table shows decisions/s, latency, Redis calls per 1000 decisions and
what it admitted against what the limit allows. Then all run at once at
twice the limit while the embedded Redis is killed and restarted on the same
port, and a second table shows what each admitted and how many calls failed
before, during and after the outage.

Redis is embedded (miniredis, in process, on a loopback port) unless -redis
names a real one; a real Redis is never killed, so the outage is skipped.
`

// The demo's fleet and limit.
const (
	demoInstances   = 3
	demoConcurrency = 8    // goroutines per instance in the throughput runs
	demoRate        = 1000 // per second, on one hot key
	demoBurst       = 200
	offeredFactor   = 2 // the outage run offers this many times the limit
)

// Shares of the outage run: Redis up, down, then restarted.
const (
	outageBefore = 0.3
	outageDown   = 0.35
)

// demoResult is what a demo measured.
type demoResult struct {
	throughput []measurement
	outage     *timeline     // nil when Redis is not embedded
	outageEnd  time.Duration // length of the outage run
	hybrid     hybridCounts  // what the hybrid fleet tells of the outage run
}

// hybridCounts are what the hybrid fleet tells of the outage run.
type hybridCounts struct {
	fallback     int64         // decisions by the local fallback
	breakerOpens int64         // circuit breaker openings, all members
	opened       time.Duration // the slowest member's breaker opened this long after the kill
	closed       time.Duration // and closed this long after the restart
	allOpened    bool          // every member's breaker opened during the outage
	allClosed    bool          // and closed again after the restart
}

func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo")
	url := fs.String("redis", "", "Redis `URL`, e.g. redis://127.0.0.1:6379/0 (default: an embedded Redis on a loopback port)")
	total := fs.Duration("duration", 12*time.Second, "how long the demo runs, at least 2s")
	plotPath := fs.String("plot", "", "write a chart of the admitted rate over time across the outage to `FILE.png`")
	if err := parseFlags(fs, args, demoSynopsis, stdout); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected argument %q", fs.Arg(0))
	case *total < 2*time.Second || *total > time.Hour:
		return usagef("-duration %v must be between 2s and 1h", *total)
	case *plotPath != "" && *url != "":
		return usagef("-plot charts the outage, which only the embedded Redis goes through (drop -redis)")
	case *plotPath != "" && !strings.EqualFold(filepath.Ext(*plotPath), ".png"):
		return usagef("-plot %q: the chart is a PNG file, name it *.png", *plotPath)
	}
	srv, err := openServer(ctx, *url)
	if err != nil {
		return err
	}
	defer srv.close()
	limit := tierlimit.PerSecond(demoRate).WithBurst(demoBurst)
	fmt.Fprintf(stdout, "tierlimit demo: per strategy, %d instances, each with its own Redis client, share a limit of %v on one hot key\nRedis: %s\n\n",
		demoInstances, limit, srv.name)

	prog := newProgress(stderr, *total)
	res, err := runDemo(ctx, srv, limit, *total, prog)
	prog.stop()
	if err != nil {
		return err
	}
	if err := printThroughput(stdout, res.throughput, demoInstances, demoConcurrency, srv.embedded()); err != nil {
		return err
	}
	if res.outage == nil {
		fmt.Fprintf(stdout, "\nOutage: skipped. The demo never kills a real Redis (%s); run it without -redis to see one.\n", srv.name)
		return nil
	}
	if err := printOutage(stdout, res, limit); err != nil {
		return err
	}
	if *plotPath != "" {
		if err := writePlot(*plotPath, res.outage, res.outageEnd, limit, allStrategies); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		fmt.Fprintf(stdout, "\nChart of the outage run written to %s\n", *plotPath)
	}
	return nil
}

// runDemo runs the throughput runs, then, on the embedded Redis, the
// outage run: total in all.
func runDemo(ctx context.Context, srv *server, limit tierlimit.Limit, total time.Duration, prog *progress) (demoResult, error) {
	var res demoResult
	each := total / time.Duration(len(allStrategies))
	if srv.embedded() {
		each /= 2
	}
	run := fmt.Sprintf("tierlimit-demo:%x", time.Now().UnixNano())
	for i, s := range allStrategies {
		prog.step(fmt.Sprintf("throughput %d/%d: %s", i+1, len(allStrategies), s))
		f, err := newFleet(srv, s, limit, demoInstances, demoConcurrency+4)
		if err != nil {
			return res, err
		}
		m := hammer(ctx, f, newKeySpace(run+":"+s, 1, 0), demoConcurrency, each)
		f.close() // a failed refund at the end does not change what was measured
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.throughput = append(res.throughput, m)
	}
	if !srv.embedded() {
		return res, nil
	}
	return res, outageRun(ctx, srv, limit, total/2, run, prog, &res)
}

// outageRun runs every strategy at once, paced at offeredFactor times the
// limit, for d: Redis up, killed, then restarted empty on its port.
func outageRun(ctx context.Context, srv *server, limit tierlimit.Limit, d time.Duration, run string, prog *progress, res *demoResult) error {
	// Warm up until the buckets, full at first, are drained, so that the
	// table and the chart show the steady state. The recorded run is cut
	// in 60 bins, with the phase changes on bin boundaries.
	warm := min(d/4, drainTime(limit)+200*time.Millisecond)
	d -= warm
	tl := newTimeline(allStrategies, d, d/60)
	var fleets []*fleet
	defer func() {
		for _, f := range fleets {
			f.close()
		}
	}()
	for _, s := range allStrategies {
		f, err := newFleet(srv, s, limit, demoInstances, 4)
		if err != nil {
			return err
		}
		fleets = append(fleets, f)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	offered := float64(offeredFactor*limit.Rate) / limit.Period.Seconds()
	for _, f := range fleets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl.pace(runCtx, f, run+":outage:"+f.strategy, offered)
		}()
	}
	err := outageSchedule(ctx, srv, tl, warm, d, prog)
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	res.outage, res.outageEnd = tl, time.Since(tl.start)
	for _, f := range fleets {
		if f.strategy == stratHybrid {
			st := f.hybridStats()
			res.hybrid = hybridCounts{fallback: st.Fallback, breakerOpens: st.BreakerOpens}
			res.hybrid.opened, res.hybrid.closed, res.hybrid.allOpened, res.hybrid.allClosed = f.breakerTimes(
				tl.start.Add(tl.changedAt(phaseDown)), tl.start.Add(tl.changedAt(phaseAfter)))
		}
	}
	return nil
}

// outageSchedule warms up, then lets the run go on with Redis up, kills
// Redis, restarts it, and returns at the run's end, d after the warm-up.
func outageSchedule(ctx context.Context, srv *server, tl *timeline, warm, d time.Duration, prog *progress) error {
	sleep := func(until time.Time) error {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	at := func(share float64) time.Time { return tl.start.Add(time.Duration(share * float64(d))) }
	prog.step("outage run: warming up")
	if err := sleep(time.Now().Add(warm)); err != nil {
		return err
	}
	tl.begin()
	prog.step("outage run: Redis up")
	if err := sleep(at(outageBefore)); err != nil {
		return err
	}
	_ = tl.change(phaseDown, func() error { srv.kill(); return nil })
	prog.step("outage run: Redis killed")
	if err := sleep(at(outageBefore + outageDown)); err != nil {
		return err
	}
	if err := tl.change(phaseAfter, srv.restart); err != nil {
		return err
	}
	prog.step("outage run: Redis restarted, empty, on the same port")
	return sleep(at(1))
}

// drainTime is how long the outage run's load takes to empty a full bucket
// of limit.
func drainTime(limit tierlimit.Limit) time.Duration {
	return time.Duration(float64(limit.Capacity()) / float64((offeredFactor-1)*limit.Rate) * float64(limit.Period))
}

// printThroughput prints the table of the closed-loop runs and what it
// means. embedded says the Redis was miniredis.
func printThroughput(w io.Writer, ms []measurement, instances, conc int, embedded bool) error {
	if len(ms) == 0 {
		return nil
	}
	fmt.Fprintf(w, "Throughput: each strategy alone for %.1fs, %d goroutines per instance calling as fast as they can\n",
		ms[0].elapsed.Seconds(), conc)
	var t table
	t.add("strategy", "decisions/s", "p50", "p99", "Redis calls/1000", "admitted", "limit allows", "admitted/allows", "errors")
	byName := map[string]*measurement{}
	for i := range ms {
		m := &ms[i]
		byName[m.strategy] = m
		t.add(m.strategy, count(int64(m.perSecond())), latency(m.latency.Quantile(0.5)), latency(m.latency.Quantile(0.99)),
			perThousand(m.callsPer1000()), count(m.admitted), count(m.allowed), percent(m.admitted, m.allowed), count(m.errors))
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "- limit allows: the most one token bucket per key admits for the demand each key saw.\n")
	if byName[stratLocal] != nil && instances > 1 {
		fmt.Fprintf(w, "- local: each instance keeps its own buckets, so %d instances admit up to %d× what the limit allows.\n",
			instances, instances)
	}
	h, tb := byName[stratHybrid], byName[stratTB]
	if h != nil && tb != nil && h.calls > 0 && tb.calls > 0 {
		fmt.Fprintf(w, "- hybrid: 1/%s of remote-tb's Redis calls per decision: its instances spend leased tokens in process.\n",
			count(int64(math.Round(tb.callsPer1000()/h.callsPer1000()))))
	}
	if h != nil && h.fallback > 0 {
		above := ""
		if h.admitted > h.allowed {
			above = ": its admissions are what went above the limit"
		}
		fmt.Fprintf(w, "- hybrid: %s decisions fell back to the local limiter, as Redis answered slower than the %v budget%s.\n",
			count(h.fallback), hybridCallBudget, above)
		if embedded {
			fmt.Fprintf(w, "  The embedded Redis shares this process's processors with the load, which can hold it back that long.\n")
		}
	}
	for _, m := range ms {
		if m.errors > 0 {
			fmt.Fprintf(w, "- %s: %s calls failed, e.g. %s\n", m.strategy, count(m.errors), oneLine(m.firstErr))
		}
	}
	if embedded && (byName[stratTB] != nil || byName[stratGCRA] != nil) {
		fmt.Fprintf(w, "- remote-*: the embedded Redis (interpreted Lua, in this process) sets their pace; a real Redis is much faster (-redis).\n")
	}
	return nil
}

// printOutage prints the table of the outage run and what it means.
func printOutage(w io.Writer, res demoResult, limit tierlimit.Limit) error {
	tl := res.outage
	spans := tl.phaseSpans(res.outageEnd)
	offered := offeredFactor * limit.Rate
	fmt.Fprintf(w, "\nOutage: all strategies at once, each offered %s per %v (%d× the limit); the embedded Redis killed at %.1fs, restarted empty on its port at %.1fs, end at %.1fs\n",
		count(offered), limit.Period, offeredFactor, tl.changedAt(phaseDown).Seconds(), tl.changedAt(phaseAfter).Seconds(), res.outageEnd.Seconds())
	var t table
	t.add("strategy", "admitted/s: Redis up", "down", "restarted", "errors: Redis up", "down", "restarted")
	for _, name := range allStrategies {
		s := tl.series[name]
		row := []string{name}
		for p := range phases {
			row = append(row, count(int64(float64(s.admits[p].Load())/spans[p].Seconds())))
		}
		for p := range phases {
			row = append(row, count(s.errs[p].Load()))
		}
		t.add(row...)
	}
	if err := t.write(w); err != nil {
		return err
	}
	redial := false
	for _, name := range allStrategies {
		s := tl.series[name]
		down, failed := s.decisions[phaseDown].Load(), s.errs[phaseDown].Load()
		redial = redial || (name != stratHybrid && s.errs[phaseAfter].Load() > 0)
		switch {
		case name == stratLocal:
			fmt.Fprintf(w, "- local: never calls Redis, so the outage changes nothing: each instance still admits the whole limit.\n")
		case name == stratHybrid && failed == 0:
			h := res.hybrid
			fmt.Fprintf(w, "- hybrid: no call failed: %s decisions came from the local fallback, at %v per instance (%v for the fleet).\n",
				count(h.fallback), share(limit, demoInstances), limit)
			if h.allOpened {
				closed := "had not all closed by the end of the run"
				if h.allClosed {
					closed = fmt.Sprintf("closed within %v of the restart", h.closed.Round(time.Millisecond))
				}
				fmt.Fprintf(w, "  Its circuit breakers opened within %v of the kill (%d openings in all: each failed probe reopens one) and %s.\n",
					h.opened.Round(time.Millisecond), h.breakerOpens, closed)
			}
			fmt.Fprintf(w, "  When Redis dies, the instances first spend the leases they hold, and the fallback buckets start full: one burst more.\n")
		case failed > 0 && down == 0:
			fmt.Fprintf(w, "- %s: every call failed while Redis was down (%s): the remote tier reports Redis failures, and its caller chooses to fail open or closed.\n",
				name, oneLine(s.errText(phaseDown)))
		case failed > 0:
			fmt.Fprintf(w, "- %s: %s calls failed while Redis was down (%s).\n", name, count(failed), oneLine(s.errText(phaseDown)))
		}
	}
	fmt.Fprintf(w, "- The restarted Redis is empty: every bucket is full again, so the Redis-backed strategies may admit one extra burst (%s) after it.\n",
		count(limit.Capacity()))
	if redial {
		fmt.Fprintf(w, "- go-redis redials a Redis it found dead once a second: remote calls fail for up to a second after the restart.\n")
	}
	return nil
}
