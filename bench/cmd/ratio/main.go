// Command ratio reads `go test -bench` output and prints, for every
// sub-benchmark, the median of each unit (ns/op, server-ns/op, B/op,
// allocs/op) and its ratio to the baseline sub-benchmark of the same parent
// (default redis_rate), with a verdict against the bar: ns/op at most -ns
// times the baseline's (default 1.1) and B/op at most the baseline's.
//
// Usage:
//
//	go run ./cmd/ratio [-base redis_rate] [-ns 1.1] results/remote.txt
//
// With no file it reads standard input.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// units are the columns printed, in order; a unit absent from the input
// prints as "-".
var units = []string{"ns/op", "server-ns/op", "B/op", "allocs/op"}

func main() {
	base := flag.String("base", "redis_rate", "sub-benchmark every other is divided by")
	nsBar := flag.Float64("ns", 1.1, "largest acceptable ns/op ratio")
	flag.Parse()
	in := io.Reader(os.Stdin)
	if flag.NArg() > 0 {
		f, err := os.Open(flag.Arg(0))
		if err != nil {
			fmt.Fprintln(os.Stderr, "ratio:", err)
			os.Exit(1)
		}
		defer f.Close()
		in = f
	}
	s, err := parse(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratio:", err)
		os.Exit(1)
	}
	if err := report(os.Stdout, s, *base, *nsBar); err != nil {
		fmt.Fprintln(os.Stderr, "ratio:", err)
		os.Exit(1)
	}
}

// samples holds every value seen, by benchmark name (without the -GOMAXPROCS
// suffix) and unit, with names in order of first appearance.
type samples struct {
	names  []string
	values map[string]map[string][]float64
}

// procs is the -N suffix go test appends to benchmark names.
var procs = regexp.MustCompile(`-\d+$`)

// parse reads benchmark lines: name, iterations, then value-unit pairs.
func parse(r io.Reader) (*samples, error) {
	s := &samples{values: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procs.ReplaceAllString(f[0], "")
		if s.values[name] == nil {
			s.values[name] = map[string][]float64{}
			s.names = append(s.names, name)
		}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: value %q: %v", name, f[i], err)
			}
			s.values[name][f[i+1]] = append(s.values[name][f[i+1]], v)
		}
	}
	return s, sc.Err()
}

// median returns the median of vs; ok is false when vs is empty.
func median(vs []float64) (m float64, ok bool) {
	if len(vs) == 0 {
		return 0, false
	}
	vs = slices.Sorted(slices.Values(vs))
	h := len(vs) / 2
	if len(vs)%2 == 1 {
		return vs[h], true
	}
	return (vs[h-1] + vs[h]) / 2, true
}

// split returns a benchmark's parent and last element.
func split(name string) (parent, sub string) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}

// report prints one row per non-baseline sub-benchmark: medians, ratios to
// its parent's baseline, and the verdict.
func report(w io.Writer, s *samples, base string, nsBar float64) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "benchmark\t")
	for _, u := range units {
		fmt.Fprintf(tw, "%s\t×%s\t", u, base)
	}
	fmt.Fprint(tw, "verdict\t\n")
	rows := 0
	for _, name := range s.names {
		parent, sub := split(name)
		b, ok := s.values[parent+"/"+base]
		if sub == base || !ok {
			continue
		}
		rows++
		fmt.Fprintf(tw, "%s\t", name)
		ratio := map[string]float64{}
		for _, u := range units {
			m, ok1 := median(s.values[name][u])
			bm, ok2 := median(b[u])
			switch {
			case !ok1 || !ok2:
				fmt.Fprint(tw, "-\t-\t")
			case bm == 0:
				// 0 vs 0 is even; anything vs 0 is infinitely worse.
				ratio[u] = math.Inf(1)
				if m == 0 {
					ratio[u] = 1
				}
				fmt.Fprintf(tw, "%.6g\t%.2f\t", m, ratio[u])
			default:
				ratio[u] = m / bm
				fmt.Fprintf(tw, "%.6g\t%.2f\t", m, ratio[u])
			}
		}
		fmt.Fprintf(tw, "%s\t\n", verdict(ratio, nsBar))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rows == 0 {
		return fmt.Errorf("no sub-benchmark with a %q sibling", base)
	}
	return nil
}

// verdict says whether a row meets the bar, and if not which part misses.
func verdict(ratio map[string]float64, nsBar float64) string {
	ns, okNS := ratio["ns/op"]
	bytes, okB := ratio["B/op"]
	if !okNS || !okB {
		return "no data"
	}
	var miss []string
	if ns > nsBar {
		miss = append(miss, fmt.Sprintf("ns/op %.2f× > %.2f×", ns, nsBar))
	}
	if bytes > 1 {
		miss = append(miss, fmt.Sprintf("B/op %.2f× > 1×", bytes))
	}
	if len(miss) == 0 {
		return "ok"
	}
	return "MISS: " + strings.Join(miss, ", ")
}
