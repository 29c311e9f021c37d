package main

import (
	"bytes"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sample is BenchmarkCompare output of two samples for two scenarios, with
// another benchmark's line and a sample that reports errors.
const sample = `goos: linux
BenchmarkCompare/hot/serial/hybrid-2   	 1000	 100.0 ns/op	 0.01 allowed/op	 0 redis-calls/op	 0 redis-cmds/op	 0 B/op	 0 allocs/op
BenchmarkCompare/hot/serial/hybrid-2   	 1000	 300.0 ns/op	 0.01 allowed/op	 0.0001 redis-calls/op	 0.0002 redis-cmds/op	 0 B/op	 0 allocs/op
BenchmarkCompare/hot/serial/syncmap_xrate-2 	 1000	 100.0 ns/op	 0.01 allowed/op	 0 redis-calls/op	 0 redis-cmds/op	 0 B/op	 0 allocs/op
BenchmarkCompare/hot/serial/syncmap_xrate-2 	 1000	 100.0 ns/op	 0.01 allowed/op	 0 redis-calls/op	 0 redis-cmds/op	 0 B/op	 0 allocs/op
BenchmarkCompare/hot/serial/redis_rate-2    	 1000	 40000 ns/op	 0.07 allowed/op	 1 redis-calls/op	 1 redis-cmds/op	 690 B/op	 21 allocs/op
BenchmarkCompare/hot/serial/redis_rate-2    	 1000	 40000 ns/op	 0.07 allowed/op	 1 redis-calls/op	 1 redis-cmds/op	 690 B/op	 21 allocs/op
BenchmarkCompare/hot/parallel/throttled_redis-2 	 1000	 30000 ns/op	 0.002 errors/op	 0.08 allowed/op	 1.2 redis-calls/op	 2.2 redis-cmds/op	 4000 B/op	 25 allocs/op
BenchmarkCompare/hot/parallel/throttled_redis-2 	 1000	 50000 ns/op	 0.08 allowed/op	 1.2 redis-calls/op	 2.2 redis-cmds/op	 4000 B/op	 25 allocs/op
BenchmarkCompare/hot/parallel/redis_rate-2    	 1000	 20000 ns/op	 0.07 allowed/op	 1 redis-calls/op	 1 redis-cmds/op	 690 B/op	 21 allocs/op
BenchmarkRemote/gcra-2 	 1000	 40000 ns/op	 500 B/op	 13 allocs/op
PASS
`

func TestParse(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var names []string
	for _, r := range res.rows {
		names = append(names, r.name)
	}
	// Known contenders come in the order of known, not of the input.
	if got, want := strings.Join(names, ","), "hybrid,syncmap_xrate,throttled_redis,redis_rate"; got != want {
		t.Errorf("rows = %s, want %s", got, want)
	}
	if got, ok := res.median(cell{"hot", "serial", "hybrid"}, "ns/op"); !ok || got != 200 {
		t.Errorf("median hybrid ns/op = %v, %v; want 200, true", got, ok)
	}
	if lo, hi := res.samples(); lo != 1 || hi != 2 {
		t.Errorf("samples() = %d, %d; want 1, 2", lo, hi)
	}
	if _, err := parse(strings.NewReader("BenchmarkRemote/gcra-2 1 2 ns/op\n")); !errors.Is(err, errNoResults) {
		t.Errorf("parse without BenchmarkCompare: err = %v, want errNoResults", err)
	}
}

func TestTables(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var b strings.Builder
	if err := writeTables(&b, res); err != nil {
		t.Fatalf("writeTables: %v", err)
	}
	out := b.String()
	for _, want := range []string{
		"| tierlimit hybrid | 200 | – | – | – | – | – |",                  // ns/op
		"| tierlimit hybrid | 2 | – |",                                    // ÷ syncmap_xrate
		"| tierlimit hybrid | 0.005 | – |",                                // ÷ redis_rate
		"| tierlimit hybrid | 0.05 |",                                     // round trips per 1000
		"| go-redis/redis_rate | 40000 | – | – | 20000 | – | – |",         // ns/op, parallel column
		"| throttled goredisstore.v9 | – | – | – | 2 | – | – |",           // ÷ redis_rate, parallel
		"throttled goredisstore.v9, hot key, parallel: in 1 of 2 samples", // error list
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q; got:\n%s", want, out)
		}
	}
}

func TestCharts(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	dir := t.TempDir()
	for _, c := range charts {
		path := filepath.Join(dir, c.file)
		if err := c.draw(res, path); err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s is not a PNG: %v", c.file, err)
		}
		if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 300 {
			t.Errorf("%s is %v, want at least 1000×300", c.file, b.Size())
		}
	}
}

// TestDocsMatchRecordedRun checks that the tables in docs/comparison.md are
// what this command prints for the run they came from, whose raw output is
// kept in bench/testdata: a figure edited by hand, or a rerun recorded in
// only one of the two places, fails here.
func TestDocsMatchRecordedRun(t *testing.T) {
	const raw, doc = "../../testdata/compare-2026-11-26b.txt", "../../../docs/comparison.md"
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parse(f)
	if err != nil {
		t.Fatalf("parse %s: %v", raw, err)
	}
	var b strings.Builder
	if err := writeTables(&b, res); err != nil {
		t.Fatalf("writeTables: %v", err)
	}
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), strings.TrimSpace(b.String())) {
		t.Errorf("%s does not contain the tables printed by `go run ./cmd/compare %s`:\n%s", doc, strings.TrimPrefix(raw, "../../"), b.String())
	}
}
