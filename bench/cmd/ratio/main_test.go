package main

import (
	"errors"
	"github.com/tierlimit/tierlimit/bench/internal/stat"
	"io"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkRemote/tokenbucket-2   	   30000	     40000 ns/op	     600 B/op	      12 allocs/op
BenchmarkRemote/tokenbucket-2   	   30000	     42000 ns/op	     600 B/op	      12 allocs/op
BenchmarkRemote/tokenbucket-2   	   30000	     90000 ns/op	     600 B/op	      12 allocs/op
BenchmarkRemote/redis_rate-2    	   30000	     40000 ns/op	     500 B/op	      14 allocs/op
BenchmarkRemote/redis_rate-2    	   30000	     38000 ns/op	     500 B/op	      14 allocs/op
BenchmarkRemote/redis_rate-2    	   30000	     39000 ns/op	     500 B/op	      14 allocs/op
BenchmarkRemote/gcra-2          	   30000	     39000 ns/op	     400 B/op	      10 allocs/op
PASS
ok  	github.com/tierlimit/tierlimit/bench	12.3s
`

func TestParseMedian(t *testing.T) {
	s, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got, want := strings.Join(s.names, ","), "BenchmarkRemote/tokenbucket,BenchmarkRemote/redis_rate,BenchmarkRemote/gcra"; got != want {
		t.Errorf("names = %s, want %s", got, want)
	}
	for _, c := range []struct {
		name, unit string
		want       float64
	}{
		{"BenchmarkRemote/tokenbucket", "ns/op", 42000},
		{"BenchmarkRemote/redis_rate", "ns/op", 39000},
		{"BenchmarkRemote/tokenbucket", "B/op", 600},
	} {
		if got, ok := stat.Median(s.values[c.name][c.unit]); !ok || got != c.want {
			t.Errorf("median %s %s = %v, %v; want %v, true", c.name, c.unit, got, ok, c.want)
		}
	}
}

func TestReportVerdicts(t *testing.T) {
	s, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var b strings.Builder
	if err := report(&b, s, "redis_rate", 1.1); err != nil {
		t.Fatalf("report: %v", err)
	}
	out := b.String()
	for _, want := range []string{
		"BenchmarkRemote/tokenbucket", "1.08", "1.20", "MISS: B/op 1.20× > 1×",
		"BenchmarkRemote/gcra", "1.00", "0.80", "ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BenchmarkRemote/redis_rate ") {
		t.Errorf("report has a row for the baseline itself:\n%s", out)
	}
	if err := report(&b, s, "nosuch", 1.1); err == nil {
		t.Error("report with a missing baseline: err = nil, want an error")
	}
}

func TestVerdictNS(t *testing.T) {
	got := verdict(map[string]float64{"ns/op": 1.25, "B/op": 0.5}, 1.1)
	if want := "MISS: ns/op 1.25× > 1.10×"; got != want {
		t.Errorf("verdict = %q, want %q", got, want)
	}
}

const mixed = sample + `BenchmarkHotKey/allowed/hybrid-2      	10000000	       30.0 ns/op	         0.100 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKey/allowed/hybrid-2      	10000000	       32.0 ns/op	         0.300 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKey/allowed/hybrid-2      	10000000	       90.0 ns/op	         0.200 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKey/allowed/xrate-2       	20000000	       20.0 ns/op	         0 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKey/allowed/redis_rate-2  	   20000	     64000 ns/op	      1000 redis-calls/1k	     700 B/op	      22 allocs/op
BenchmarkHotKeyParallel/saturated/hybrid-2  	10000000	       40.0 ns/op	         5.00 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKeyParallel/saturated/xrate-2   	10000000	       50.0 ns/op	         0 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkHotKeyParallel/saturated/redis_rate-2	   20000	     40000 ns/op	      1000 redis-calls/1k	     700 B/op	      22 allocs/op
BenchmarkZipf10k/serial/hybrid-2         	 1000000	       100 ns/op	         2.00 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkZipf10k/serial/hybrid_ttl10s-2  	 1000000	       120 ns/op	         1.00 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkZipf10k/serial/syncmap_xrate-2  	 1000000	       80 ns/op	         0 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkZipf10k/parallel/hybrid-2       	 1000000	       50 ns/op	         2.00 redis-calls/1k	       0 B/op	       0 allocs/op
BenchmarkZipf10k/parallel/syncmap_xrate-2	 1000000	       100 ns/op	         0 redis-calls/1k	       0 B/op	       0 allocs/op
`

// row returns the whitespace-separated fields of out's line for benchmark
// name, or nil.
func row(out, name string) []string {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	return nil
}

func TestReportAgainst(t *testing.T) {
	s, err := parse(strings.NewReader(mixed))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var b strings.Builder
	if err := report(&b, s, "redis_rate", 1.1); err != nil {
		t.Fatalf("report: %v", err)
	}
	if out := b.String(); strings.Contains(out, "HotKey") || strings.Contains(out, "Zipf") {
		t.Errorf("remote report has rows for parents with baselines of their own:\n%s", out)
	}
	b.Reset()
	n, err := reportAgainst(&b, s, against, false)
	if err != nil {
		t.Fatalf("reportAgainst: %v", err)
	}
	out := b.String()
	if n != 5 {
		t.Errorf("reportAgainst printed %d rows, want 5:\n%s", n, out)
	}
	for _, c := range []struct {
		name string
		want []string // ns/op, allocs/op, redis-calls/1k, then per baseline: its ns/op and the quotient
	}{
		// median 32 ns/op: 1.6× xrate's 20, 2000× faster than redis_rate's 64000.
		{"BenchmarkHotKey/allowed/hybrid", []string{"32", "0", "0.2", "20", "1.6", "64000", "2000"}},
		{"BenchmarkHotKeyParallel/saturated/hybrid", []string{"40", "0", "5", "50", "0.8", "40000", "1000"}},
		{"BenchmarkZipf10k/serial/hybrid", []string{"100", "0", "2", "80", "1.25"}},
		{"BenchmarkZipf10k/serial/hybrid_ttl10s", []string{"120", "0", "1", "80", "1.5"}},
		{"BenchmarkZipf10k/parallel/hybrid", []string{"50", "0", "2", "100", "0.5"}},
	} {
		got := row(out, c.name)
		if got == nil || strings.Join(got[1:], " ") != strings.Join(c.want, " ") {
			t.Errorf("row %s = %q, want %q; output:\n%s", c.name, got, c.want, out)
		}
	}
	for _, base := range []string{"BenchmarkHotKey/allowed/xrate", "BenchmarkHotKey/allowed/redis_rate", "BenchmarkZipf10k/serial/syncmap_xrate", "BenchmarkRemote/tokenbucket"} {
		if row(out, base) != nil {
			t.Errorf("reportAgainst has a row for %s:\n%s", base, out)
		}
	}
	for _, h := range []string{"÷xrate", "speedup vs redis_rate", "÷syncmap_xrate"} {
		if !strings.Contains(out, h) {
			t.Errorf("reportAgainst lacks header %q:\n%s", h, out)
		}
	}
}

func TestReportAgainstOnlyHot(t *testing.T) {
	s, err := parse(strings.NewReader(strings.TrimPrefix(mixed, sample)))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if err := report(io.Discard, s, "redis_rate", 1.1); !errors.Is(err, errNoRows) {
		t.Errorf("report without remote rows: err = %v, want errNoRows", err)
	}
	if n, err := reportAgainst(io.Discard, s, against, false); n != 5 || err != nil {
		t.Errorf("reportAgainst = %d, %v; want 5, nil", n, err)
	}
}

func TestQuotient(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		want string
	}{
		{1, 3, "0.333"}, {64000, 31, "2065"}, {0, 0, "1"}, {1, 0, "+Inf"}, {150, 100, "1.5"},
	} {
		if got := quotient(c.a, c.b); got != c.want {
			t.Errorf("quotient(%v, %v) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}
