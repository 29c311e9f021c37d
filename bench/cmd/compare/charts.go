package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chart is one PNG written by -img.
type chart struct {
	file string
	draw func(res *results, path string) error
}

var charts = []chart{
	{"compare-ns-per-decision.png", nsChart},
	{"compare-redis-round-trips.png", tripsChart},
}

// series are the scenarios, one marker each.
var series = []struct {
	scenario, label string
	shape           draw.GlyphDrawer
	color           color.Color
}{
	{"hot", "hot key", draw.CircleGlyph{}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}},
	{"uniform10k", "10k keys, uniform", draw.BoxGlyph{}, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
	{"zipf10k", "10k keys, Zipf s=1.1", draw.PyramidGlyph{}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}},
}

// Chart geometry: points (1/72 in) at 150 dpi.
const (
	dpi        = 150
	chartWidth = 11 * vg.Inch
	rowHeight  = 0.4 * vg.Inch
	chartExtra = 1.6 * vg.Inch // titles, axis and legend
)

// nsChart draws ns/op per contender, serial and parallel side by side, on
// a log scale.
func nsChart(res *results, path string) error {
	lo, hi := res.samples()
	var panels []*plot.Plot
	for _, mode := range []string{"serial", "parallel"} {
		p, err := dotPlot(res, res.rows, mode, func(c cell) (float64, bool) { return res.median(c, "ns/op") })
		if err != nil {
			return err
		}
		p.Title.Text = fmt.Sprintf("%s: ns per decision (median of %s runs)", mode, runs(lo, hi))
		p.X.Label.Text = "ns/op, log scale (lower is faster)"
		panels = append(panels, p)
	}
	panels[1].Legend = plot.NewLegend() // one legend is enough
	return save(path, panels, len(res.rows))
}

// tripsChart draws Redis round trips per 1000 decisions for the contenders
// that use Redis, on a log scale; a median of 0 is drawn at the left edge and
// labelled.
func tripsChart(res *results, path string) error {
	var rows []contender
	for _, r := range res.rows {
		if r.redis {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("no contender using Redis")
	}
	lo, hi := res.samples()
	per1k := func(c cell) (float64, bool) {
		m, ok := res.median(c, "redis-calls/op")
		return 1000 * m, ok
	}
	var panels []*plot.Plot
	for _, mode := range []string{"serial", "parallel"} {
		p, err := dotPlot(res, rows, mode, per1k)
		if err != nil {
			return err
		}
		p.Title.Text = fmt.Sprintf("%s: Redis round trips (median of %s runs)", mode, runs(lo, hi))
		p.X.Label.Text = "per 1000 decisions, log scale (0: left edge)"
		panels = append(panels, p)
	}
	panels[1].Legend = plot.NewLegend()
	return save(path, panels, len(rows))
}

func runs(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

// dotPlot plots value for every row and scenario of one mode: a row per
// contender, first at the top, a marker per scenario. Values of 0 go to the
// axis minimum, labelled "0"; missing values are left out.
func dotPlot(res *results, rows []contender, mode string, value func(cell) (float64, bool)) (*plot.Plot, error) {
	p := plot.New()
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plainLogTicks{}
	grid := plotter.NewGrid()
	grid.Horizontal.Color = color.Gray{Y: 0xe8}
	grid.Vertical.Color = color.Gray{Y: 0xd0}
	p.Add(grid)

	// Both modes share one range, so that the panels compare at a glance;
	// the smallest positive value sets where zeros are drawn.
	minPos, maxV := math.Inf(1), 0.0
	for _, r := range rows {
		for _, s := range series {
			for _, m := range []string{"serial", "parallel"} {
				if v, ok := value(cell{s.scenario, m, r.name}); ok && v > 0 {
					minPos, maxV = min(minPos, v), max(maxV, v)
				}
			}
		}
	}
	if math.IsInf(minPos, 1) {
		return nil, fmt.Errorf("%s: no positive value to plot", mode)
	}
	floor := math.Pow(10, math.Floor(math.Log10(minPos)-0.3))
	p.X.Min, p.X.Max = floor, 2*maxV

	n := len(rows)
	labels := make([]string, n)
	var zeros plotter.XYLabels
	for si, s := range series {
		var pts plotter.XYs
		for i, r := range rows {
			labels[n-1-i] = r.label
			v, ok := value(cell{s.scenario, mode, r.name})
			if !ok {
				continue
			}
			y := float64(n-1-i) + 0.22*float64(1-si) // scenarios side by side in a row
			if v <= 0 {
				v = floor
				zeros.XYs = append(zeros.XYs, plotter.XY{X: v, Y: y})
				zeros.Labels = append(zeros.Labels, " 0")
			}
			pts = append(pts, plotter.XY{X: v, Y: y})
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: s.color, Radius: vg.Points(4), Shape: s.shape}
		p.Add(sc)
		p.Legend.Add(s.label, sc)
	}
	if len(zeros.XYs) > 0 {
		l, err := plotter.NewLabels(zeros)
		if err != nil {
			return nil, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].YAlign = draw.YCenter
			l.TextStyle[i].XAlign = draw.XLeft
		}
		l.Offset = vg.Point{X: vg.Points(5)}
		p.Add(l)
	}
	// An empty row at the top holds the legend.
	p.NominalY(append(labels, "")...)
	p.Y.Min, p.Y.Max = -0.6, float64(n)+0.6
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.YOffs = 0
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.X.Label.TextStyle.Font.Size = vg.Points(10)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	return p, nil
}

// save draws panels side by side into a PNG at path.
func save(path string, panels []*plot.Plot, rows int) error {
	h := chartExtra + vg.Length(rows)*rowHeight
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, h), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Points(14), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	for i, p := range panels {
		p.Draw(tiles.At(dc, i, 0))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plainLogTicks are plot.LogTicks with only powers of ten labelled, without
// exponents (1000000, not 1e+06) and with a thin space between thousands.
type plainLogTicks struct{}

func (plainLogTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, t := range (plot.LogTicks{Prec: -1}).Ticks(lo, hi) {
		if t.Value < lo || t.Value > hi {
			continue // a label past the axis would take room from the data
		}
		if e := math.Log10(t.Value); t.Label != "" && math.Abs(e-math.Round(e)) < 1e-9 {
			t.Label = group(strconv.FormatFloat(t.Value, 'f', -1, 64))
		} else {
			t.Label = "" // only powers of ten are labelled
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// group puts a thin space between groups of three digits of a whole number
// of five digits or more.
func group(s string) string {
	if len(s) < 5 || strings.Contains(s, ".") {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u2009")
		}
		b.WriteRune(r)
	}
	return b.String()
}
