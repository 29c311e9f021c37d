// Command compare reads the output of BenchmarkCompare (go test -bench, any
// -count) and, from the median of each sub-benchmark's samples, prints
// markdown tables (ns/op; its ratio to x/time/rate in a sync.Map and to
// redis_rate, measured in the same run; Redis round trips per 1000
// decisions; B/op and allocs/op; share allowed) and, with -img, writes PNG
// charts of ns/op and of Redis round trips to that directory.
//
// Usage:
//
//	go run ./cmd/compare [-img ../docs/img] results/compare.txt
//
// With no file it reads standard input. Lines of other benchmarks are
// ignored.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"github.com/tierlimit/tierlimit/bench/internal/stat"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Baselines of the ratio tables, by contender name.
const (
	xrateBase = "syncmap_xrate"
	redisBase = "redis_rate"
)

// contender describes a row: its name in the benchmark and its label.
type contender struct {
	name, label string
	redis       bool // talks to Redis, so its round trips are charted
}

// known lists the contenders in the order of the tables and charts: ours,
// then the peers in process, then the peers on Redis. Contenders found in
// the input but not here follow, labelled with their name.
var known = []contender{
	{"local", "tierlimit local", false},
	{"hybrid", "tierlimit hybrid", true},
	{"tokenbucket", "tierlimit remote token bucket", true},
	{"gcra", "tierlimit remote GCRA", true},
	{"xrate", "x/time/rate, one limiter", false},
	{"syncmap_xrate", "x/time/rate in a sync.Map", false},
	{"sethvargo_memory", "sethvargo/go-limiter memorystore", false},
	{"ulule_memory", "ulule/limiter memory store", false},
	{"ulule_redis", "ulule/limiter redis store", true},
	{"throttled_redis", "throttled goredisstore.v9", true},
	{"redis_rate", "go-redis/redis_rate", true},
}

// columns are the scenario/mode pairs, in table order.
var columns = []struct{ scenario, mode, head string }{
	{"hot", "serial", "hot key, serial"},
	{"uniform10k", "serial", "10k uniform, serial"},
	{"zipf10k", "serial", "10k Zipf, serial"},
	{"hot", "parallel", "hot key, parallel"},
	{"uniform10k", "parallel", "10k uniform, parallel"},
	{"zipf10k", "parallel", "10k Zipf, parallel"},
}

// cell identifies one sub-benchmark.
type cell struct{ scenario, mode, name string }

// results holds every sample by sub-benchmark and unit.
type results struct {
	values map[cell]map[string][]float64
	rows   []contender // in table order
}

// line matches a BenchmarkCompare result: name, -GOMAXPROCS, iterations,
// then value-unit pairs.
var line = regexp.MustCompile(`^BenchmarkCompare/([^/\s]+)/([^/\s]+)/([^/\s]+?)(-\d+)?\s+\d+\s+(.*)$`)

// errNoResults is parse's error for input with no BenchmarkCompare line.
var errNoResults = errors.New("no BenchmarkCompare results")

func parse(r io.Reader) (*results, error) {
	res := &results{values: map[cell]map[string][]float64{}}
	seen := map[string]bool{}
	var extra []contender
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		c := cell{m[1], m[2], m[3]}
		f := strings.Fields(m[5])
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("%s: odd number of fields after the iterations", sc.Text())
		}
		if res.values[c] == nil {
			res.values[c] = map[string][]float64{}
		}
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s/%s/%s: value %q: %v", c.scenario, c.mode, c.name, f[i], err)
			}
			res.values[c][f[i+1]] = append(res.values[c][f[i+1]], v)
		}
		if !seen[c.name] {
			seen[c.name] = true
			if !slices.ContainsFunc(known, func(k contender) bool { return k.name == c.name }) {
				extra = append(extra, contender{c.name, c.name, true})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(res.values) == 0 {
		return nil, errNoResults
	}
	for _, k := range known {
		if seen[k.name] {
			res.rows = append(res.rows, k)
		}
	}
	res.rows = append(res.rows, extra...)
	return res, nil
}

// median returns the median of a sub-benchmark's samples of unit; ok is
// false when there are none.
func (r *results) median(c cell, unit string) (m float64, ok bool) {
	return stat.Median(r.values[c][unit])
}

// samples returns the fewest and most samples of ns/op of any sub-benchmark.
func (r *results) samples() (lo, hi int) {
	lo = -1
	for _, u := range r.values {
		n := len(u["ns/op"])
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	return lo, hi
}

func main() {
	img := flag.String("img", "", "directory to write the PNG charts to (none when empty)")
	flag.Parse()
	in := io.Reader(os.Stdin)
	if flag.NArg() > 0 {
		f, err := os.Open(flag.Arg(0))
		if err != nil {
			fail(err)
		}
		defer f.Close()
		in = f
	}
	res, err := parse(in)
	if err != nil {
		fail(err)
	}
	if err := writeTables(os.Stdout, res); err != nil {
		fail(err)
	}
	if *img == "" {
		return
	}
	for _, c := range charts {
		path := filepath.Join(*img, c.file)
		if err := c.draw(res, path); err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		fmt.Fprintln(os.Stderr, "compare: wrote", path)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compare:", err)
	os.Exit(1)
}
