package main

import (
	"fmt"
	"github.com/tierlimit/tierlimit/bench/internal/stat"
	"io"
	"math"
	"slices"
	"strings"
)

// table is one markdown table: a value per contender and column.
type table struct {
	title string
	value func(r *results, c cell) string
}

// tables are printed in this order.
var tables = []table{
	{"ns/op (median; in the parallel columns, wall time per decision of all goroutines together)", func(r *results, c cell) string {
		return num(r.median(c, "ns/op"))
	}},
	{"ns/op spread: (slowest − fastest sample) ÷ median, for judging the ratios", func(r *results, c cell) string {
		vs := r.values[c]["ns/op"]
		m, ok := stat.Median(vs)
		if !ok || m == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f%%", 100*(slices.Max(vs)-slices.Min(vs))/m)
	}},
	{"ns/op ÷ x/time/rate in a sync.Map (" + xrateBase + "), same scenario and mode", func(r *results, c cell) string {
		return ratio(r, c, xrateBase)
	}},
	{"ns/op ÷ go-redis/redis_rate (" + redisBase + "), same scenario and mode", func(r *results, c cell) string {
		return ratio(r, c, redisBase)
	}},
	{"Redis round trips per 1000 decisions (a command or a pipeline is one)", func(r *results, c cell) string {
		m, ok := r.median(c, "redis-calls/op")
		if ok && m == 0 {
			return "0"
		}
		return num(m*1000, ok)
	}},
	{"B/op, allocs/op", func(r *results, c cell) string {
		b, ok1 := r.median(c, "B/op")
		a, ok2 := r.median(c, "allocs/op")
		if !ok1 || !ok2 {
			return "–"
		}
		return fmt.Sprintf("%s, %s", num(b, true), num(a, true))
	}},
	{"decisions allowed (%)", func(r *results, c cell) string {
		m, ok := r.median(c, "allowed/op")
		return num(100*m, ok)
	}},
}

// writeTables prints every table of res in markdown.
func writeTables(w io.Writer, res *results) error {
	lo, hi := res.samples()
	n := fmt.Sprint(lo)
	if lo != hi {
		n = fmt.Sprintf("%d to %d", lo, hi)
	}
	fmt.Fprintf(w, "Medians of %s samples per sub-benchmark.\n", n)
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "\n#### %s\n\n| limiter |", t.title)
		for _, col := range columns {
			fmt.Fprintf(&b, " %s |", col.head)
		}
		b.WriteString("\n|---|")
		b.WriteString(strings.Repeat("---:|", len(columns)))
		b.WriteString("\n")
		for _, row := range res.rows {
			fmt.Fprintf(&b, "| %s |", row.label)
			for _, col := range columns {
				fmt.Fprintf(&b, " %s |", t.value(res, cell{col.scenario, col.mode, row.name}))
			}
			b.WriteString("\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	writeErrors(w, res)
	return nil
}

// ratio formats c's median ns/op divided by base's in the same scenario and
// mode; "1" for base itself.
func ratio(r *results, c cell, base string) string {
	m, ok1 := r.median(c, "ns/op")
	bm, ok2 := r.median(cell{c.scenario, c.mode, base}, "ns/op")
	if !ok1 || !ok2 || bm == 0 {
		return "–"
	}
	return num(m/bm, true)
}

// num formats a median with three significant digits, as a whole number
// from 1000 up; "–" when there is none.
func num(v float64, ok bool) string {
	switch {
	case !ok || math.IsNaN(v):
		return "–"
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.0f", v)
	default:
		s := fmt.Sprintf("%.3g", v)
		if strings.ContainsAny(s, "e") {
			s = fmt.Sprintf("%.2g", v)
			if strings.Contains(s, "e") {
				// Tiny values: plain decimals read better in a table.
				s = strings.TrimRight(fmt.Sprintf("%.8f", v), "0")
			}
		}
		return s
	}
}

// incidents are the units a sub-benchmark reports only when they happened:
// calls that returned an error, and hybrid's decisions that fell back to its
// in-process limiter.
var incidents = []struct{ unit, title string }{
	{"errors/op", "Calls that returned an error"},
	{"fallbacks/op", "Decisions that fell back to the in-process limiter"},
}

// writeErrors lists, per incident unit, the sub-benchmarks that reported it
// in any sample, with the median and largest share of calls affected.
func writeErrors(w io.Writer, res *results) {
	for _, inc := range incidents {
		var b strings.Builder
		for _, row := range res.rows {
			for _, col := range columns {
				c := cell{col.scenario, col.mode, row.name}
				vs := res.values[c][inc.unit]
				if len(vs) == 0 {
					continue
				}
				// Samples without incidents do not report the unit: count them as 0.
				all := append(make([]float64, max(len(res.values[c]["ns/op"])-len(vs), 0)), vs...)
				m, _ := stat.Median(all)
				fmt.Fprintf(&b, "- %s, %s: in %d of %d samples; share of calls: median %s, max %s\n",
					row.label, col.head, len(vs), len(all), num(m, true), num(slices.Max(vs), true))
			}
		}
		if b.Len() > 0 {
			fmt.Fprintf(w, "\n#### %s\n\n%s", inc.title, b.String())
		}
	}
}
