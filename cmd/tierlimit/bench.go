package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/tierlimit/tierlimit"
)

const benchSynopsis = `
Usage: tierlimit bench [flags]

Measures each strategy alone, one after the other, as the demo's first table
does, with your Redis and limit: decisions/s, p50/p99 latency, Redis calls
per 1000 decisions, what was admitted against what the limit allows for the
demand each key saw, and errors. Every run uses fresh keys, which expire by
themselves. Without -redis it runs on an embedded Redis (miniredis), whose
figures say little about a real one.

With -json it prints one JSON object instead of the table; its schema
("tierlimit.bench/v1") is documented in 'go doc github.com/tierlimit/tierlimit/cmd/tierlimit'.
`

// benchSchema names the -json format; it changes only with a new name.
const benchSchema = "tierlimit.bench/v1"

// benchReport is bench's -json output. Its fields and their meaning are
// part of the schema documented in doc.go: add fields only with a new
// schema name.
type benchReport struct {
	Schema      string        `json:"schema"`
	Redis       string        `json:"redis"` // "embedded" or redis://host:port/db, never credentials
	Limit       benchLimit    `json:"limit"`
	Keys        int           `json:"keys"`
	Zipf        float64       `json:"zipf"`
	Instances   int           `json:"instances"`
	Concurrency int           `json:"concurrency"`
	DurationS   float64       `json:"duration_s"`
	Results     []benchResult `json:"results"`
}

type benchLimit struct {
	Rate     int64 `json:"rate"`
	PeriodUS int64 `json:"period_us"`
	Burst    int64 `json:"burst"`
}

type benchResult struct {
	Strategy          string  `json:"strategy"`
	ElapsedS          float64 `json:"elapsed_s"`
	Decisions         int64   `json:"decisions"`
	DecisionsPerS     float64 `json:"decisions_per_s"`
	P50NS             int64   `json:"p50_ns"`
	P99NS             int64   `json:"p99_ns"`
	RedisCalls        int64   `json:"redis_calls"`
	RedisCallsPer1000 float64 `json:"redis_calls_per_1000"`
	Admitted          int64   `json:"admitted"`
	Allowed           int64   `json:"allowed"`
	Errors            int64   `json:"errors"`
	FirstError        string  `json:"first_error"`
}

// benchConfig is bench's command line.
type benchConfig struct {
	url         string
	limit       tierlimit.Limit
	keys        int
	zipf        float64
	instances   int
	concurrency int
	duration    time.Duration
	strategies  []string
	json        bool
}

// Bounds of bench's flags: enough for any machine this runs on, and keeping
// a typo from starting a run that exhausts it.
const (
	maxKeys        = 1_000_000
	maxInstances   = 64
	maxConcurrency = 1024
)

func parseBench(args []string, stdout io.Writer) (benchConfig, error) {
	var c benchConfig
	fs := newFlags("bench")
	fs.StringVar(&c.url, "redis", "", "Redis `URL`, e.g. redis://127.0.0.1:6379/0 (default: an embedded Redis on a loopback port)")
	rate := fs.Int64("rate", 1000, "limit: events per period, per key")
	period := fs.Duration("period", time.Second, "limit: the period")
	burst := fs.Int64("burst", 0, "limit: bucket capacity (0: the rate)")
	fs.IntVar(&c.keys, "keys", 1, fmt.Sprintf("number of distinct keys, 1 to %d", maxKeys))
	fs.Float64Var(&c.zipf, "zipf", 0, "Zipf `s` parameter (> 1) skewing the keys towards the first; 0: uniform")
	fs.IntVar(&c.instances, "instances", 3, "limiter instances per strategy, each with its own Redis client")
	fs.IntVar(&c.concurrency, "concurrency", 8, "goroutines per instance, each calling as fast as it can")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "how long each strategy runs")
	strategies := fs.String("strategies", "local,remote-tb,remote-gcra,hybrid", "comma-separated strategies to run")
	fs.BoolVar(&c.json, "json", false, "print a JSON object ("+benchSchema+") instead of the table")
	if err := parseFlags(fs, args, benchSynopsis, stdout); err != nil {
		return c, err
	}
	c.limit = tierlimit.Limit{Rate: *rate, Period: *period, Burst: *burst}
	var err error
	if c.strategies, err = parseStrategies(*strategies); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, usagef("unexpected argument %q", fs.Arg(0))
	case c.limit.Validate() != nil:
		return c, usagef("-rate, -period, -burst: %v", c.limit.Validate())
	case c.keys < 1 || c.keys > maxKeys:
		return c, usagef("-keys %d must be between 1 and %d", c.keys, maxKeys)
	case c.zipf != 0 && !(c.zipf > 1 && c.zipf < 100):
		return c, usagef("-zipf %v must be 0 (uniform) or between 1 and 100, exclusive", c.zipf)
	case c.instances < 1 || c.instances > maxInstances:
		return c, usagef("-instances %d must be between 1 and %d", c.instances, maxInstances)
	case c.concurrency < 1 || c.concurrency > maxConcurrency:
		return c, usagef("-concurrency %d must be between 1 and %d", c.concurrency, maxConcurrency)
	case c.duration < 10*time.Millisecond || c.duration > time.Hour:
		return c, usagef("-duration %v must be between 10ms and 1h", c.duration)
	}
	return c, nil
}

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseBench(args, stdout)
	if err != nil {
		return err
	}
	srv, err := openServer(ctx, c.url)
	if err != nil {
		return err
	}
	defer srv.close()
	prog := newProgress(stderr, c.duration*time.Duration(len(c.strategies)))
	ms, err := runBench(ctx, srv, c, prog)
	prog.stop()
	if err != nil {
		return err
	}
	if c.json {
		return writeBenchJSON(stdout, srv, c, ms)
	}
	fmt.Fprintf(stdout, "tierlimit bench: limit %v per key, %s keys (%s), %d instances × %d goroutines per strategy\nRedis: %s\n\n",
		c.limit, count(int64(c.keys)), keyShape(c.zipf), c.instances, c.concurrency, srv.name)
	return printThroughput(stdout, ms, c.instances, c.concurrency, srv.embedded())
}

func keyShape(zipf float64) string {
	if zipf == 0 {
		return "uniform"
	}
	return fmt.Sprintf("Zipf s=%g", zipf)
}

// runBench measures each strategy of c in turn.
func runBench(ctx context.Context, srv *server, c benchConfig, prog *progress) ([]measurement, error) {
	run := fmt.Sprintf("tierlimit-bench:%x", time.Now().UnixNano())
	var ms []measurement
	for i, s := range c.strategies {
		prog.step(fmt.Sprintf("%d/%d: %s", i+1, len(c.strategies), s))
		f, err := newFleet(srv, s, c.limit, c.instances, c.concurrency+4)
		if err != nil {
			return nil, err
		}
		m := hammer(ctx, f, newKeySpace(run+":"+s, c.keys, c.zipf), c.concurrency, c.duration)
		f.close()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func writeBenchJSON(w io.Writer, srv *server, c benchConfig, ms []measurement) error {
	r := benchReport{
		Schema: benchSchema, Redis: "embedded",
		Limit: benchLimit{Rate: c.limit.Rate, PeriodUS: c.limit.PeriodMicros(), Burst: c.limit.Capacity()},
		Keys:  c.keys, Zipf: c.zipf, Instances: c.instances, Concurrency: c.concurrency,
		DurationS: c.duration.Seconds(), Results: []benchResult{},
	}
	if !srv.embedded() {
		r.Redis = srv.name
	}
	for _, m := range ms {
		r.Results = append(r.Results, benchResult{
			Strategy: m.strategy, ElapsedS: m.elapsed.Seconds(),
			Decisions: m.decisions, DecisionsPerS: m.perSecond(),
			P50NS: int64(m.latency.Quantile(0.5)), P99NS: int64(m.latency.Quantile(0.99)),
			RedisCalls: m.calls, RedisCallsPer1000: m.callsPer1000(),
			Admitted: m.admitted, Allowed: m.allowed, Errors: m.errors, FirstError: m.firstErr,
		})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
