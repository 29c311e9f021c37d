package main

import (
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
		if got, ok := median(s.values[c.name][c.unit]); !ok || got != c.want {
			t.Errorf("median %s %s = %v, %v; want %v, true", c.name, c.unit, got, ok, c.want)
		}
	}
	if got, ok := median([]float64{4, 1, 3, 2}); !ok || got != 2.5 {
		t.Errorf("median(4 1 3 2) = %v, %v; want 2.5, true", got, ok)
	}
	if _, ok := median(nil); ok {
		t.Error("median(nil) ok = true, want false")
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
