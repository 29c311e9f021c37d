// Command ratio reads `go test -bench` output and prints, for every
// sub-benchmark, the median of each unit (ns/op, server-ns/op, cmds/op,
// B/op, allocs/op) and its ratio to the baseline sub-benchmark of the same
// parent (default redis_rate), with a verdict against the bar: ns/op at most
// -ns times the baseline's (default 1.1) and B/op at most the baseline's.
//
// Parents listed in against (the hot-key and Zipf benchmarks) are left out
// of that table and get one of their own, per rule: each sub-benchmark's
// median ns/op, allocs/op and redis-calls/1k, and its ns/op against each of
// the rule's baselines, either as a ratio (ours ÷ baseline) or as a speedup
// (baseline ÷ ours).
//
// Usage:
//
//	go run ./cmd/ratio [-base redis_rate] [-ns 1.1] results/remote.txt
//
// With no file it reads standard input.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"github.com/tierlimit/tierlimit/bench/internal/stat"
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
var units = []string{"ns/op", "server-ns/op", "cmds/op", "B/op", "allocs/op"}

// baseline is one sub-benchmark the others of a parent are compared with.
type baseline struct {
	name    string
	speedup bool // print baseline ns/op ÷ ours instead of ours ÷ baseline
}

// rule gives the baselines of the parents whose names match parent.
type rule struct {
	parent *regexp.Regexp
	bases  []baseline
}

// against lists the parents compared with baselines of their own rather than
// -base. Each rule prints one table.
var against = []rule{
	{regexp.MustCompile(`^BenchmarkHotKey(Parallel)?/[^/]+$`), []baseline{{"xrate", false}, {"redis_rate", true}}},
	{regexp.MustCompile(`^BenchmarkZipf10k/(serial|parallel)$`), []baseline{{"syncmap_xrate", false}}},
}

// vsUnits are the medians printed for each row of an against table besides
// ns/op.
var vsUnits = []string{"allocs/op", "redis-calls/1k"}

// errNoRows is report's error when no parent has a -base sub-benchmark.
var errNoRows = errors.New("no sub-benchmark with a baseline sibling")

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
	err = report(os.Stdout, s, *base, *nsBar)
	if err != nil && !errors.Is(err, errNoRows) {
		fmt.Fprintln(os.Stderr, "ratio:", err)
		os.Exit(1)
	}
	n, verr := reportAgainst(os.Stdout, s, against, err == nil)
	if verr != nil {
		fmt.Fprintln(os.Stderr, "ratio:", verr)
		os.Exit(1)
	}
	if err != nil && n == 0 {
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

// split returns a benchmark's parent and last element.
func split(name string) (parent, sub string) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}

// ruled reports whether parent is compared by one of rules.
func ruled(parent string, rules []rule) bool {
	return slices.ContainsFunc(rules, func(r rule) bool { return r.parent.MatchString(parent) })
}

// report prints one row per non-baseline sub-benchmark whose parent has no
// rule in against: medians, ratios to its parent's baseline, and the
// verdict.
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
		if sub == base || !ok || ruled(parent, against) {
			continue
		}
		rows++
		fmt.Fprintf(tw, "%s\t", name)
		ratio := map[string]float64{}
		for _, u := range units {
			m, ok1 := stat.Median(s.values[name][u])
			bm, ok2 := stat.Median(b[u])
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
		return fmt.Errorf("%w: %q", errNoRows, base)
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

// reportAgainst prints, for each rule with a matching parent, a table with
// one row per sub-benchmark that is not one of the rule's baselines: its
// median ns/op and vsUnits, then each baseline's median ns/op and the ratio
// or speedup. A blank line precedes each table when gap is set, and separates
// the tables. It returns the number of rows printed.
func reportAgainst(w io.Writer, s *samples, rules []rule, gap bool) (int, error) {
	total := 0
	for _, r := range rules {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		rows := 0
		for _, name := range s.names {
			parent, sub := split(name)
			if !r.parent.MatchString(parent) || slices.ContainsFunc(r.bases, func(b baseline) bool { return b.name == sub }) {
				continue
			}
			if rows == 0 {
				if gap || total > 0 {
					fmt.Fprintln(w)
				}
				fmt.Fprint(tw, "benchmark\tns/op\t")
				for _, u := range vsUnits {
					fmt.Fprintf(tw, "%s\t", u)
				}
				for _, b := range r.bases {
					if b.speedup {
						fmt.Fprintf(tw, "%s ns/op\tspeedup vs %s\t", b.name, b.name)
					} else {
						fmt.Fprintf(tw, "%s ns/op\t÷%s\t", b.name, b.name)
					}
				}
				fmt.Fprint(tw, "\n")
			}
			rows++
			m, ok := stat.Median(s.values[name]["ns/op"])
			fmt.Fprintf(tw, "%s\t%s\t", name, num(m, ok))
			for _, u := range vsUnits {
				fmt.Fprintf(tw, "%s\t", num(stat.Median(s.values[name][u])))
			}
			for _, b := range r.bases {
				bm, bok := stat.Median(s.values[parent+"/"+b.name]["ns/op"])
				fmt.Fprintf(tw, "%s\t", num(bm, bok))
				switch {
				case !ok || !bok:
					fmt.Fprint(tw, "-\t")
				case b.speedup:
					fmt.Fprintf(tw, "%s\t", quotient(bm, m))
				default:
					fmt.Fprintf(tw, "%s\t", quotient(m, bm))
				}
			}
			fmt.Fprint(tw, "\n")
		}
		if err := tw.Flush(); err != nil {
			return total, err
		}
		total += rows
	}
	return total, nil
}

// num formats a median, or "-" when there is none.
func num(m float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.6g", m)
}

// quotient formats a ÷ b: whole numbers from 100 up (a speedup can be in
// the thousands), three significant digits below (a ratio can be well
// under 1).
func quotient(a, b float64) string {
	switch q := a / b; {
	case b == 0 && a == 0:
		return "1"
	case math.IsInf(q, 0):
		return "+Inf"
	case q >= 100:
		return fmt.Sprintf("%.0f", q)
	default:
		return fmt.Sprintf("%.3g", q)
	}
}
