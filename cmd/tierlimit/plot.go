package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The chart is drawn by hand, with image/draw and basicfont's 7×13 bitmap
// face, rather than with a plotting library: gonum.org/v1/plot brings font,
// PDF, SVG and LaTeX dependencies that a cold build downloads and compiles
// (commit 5b5ffcf has the figures), and a first "go run ./cmd/tierlimit
// demo" on a fresh clone must finish within a minute. basicfont is one
// bitmap face with no parser (an outline font would need x/image's
// opentype). Every line is horizontal or vertical, so filled rectangles
// draw them all.

// Colours of the chart.
var (
	admittedColor = color.RGBA{R: 0x1f, G: 0x4e, B: 0x9c, A: 0xff}
	errorColor    = color.RGBA{R: 0xd0, G: 0x1c, B: 0x1c, A: 0xff}
	limitColor    = color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 0xff}
	outageColor   = color.RGBA{R: 0xff, G: 0xd8, B: 0xa8, A: 0xff}
	gridColor     = color.RGBA{R: 0xe4, G: 0xe4, B: 0xe4, A: 0xff}
)

// The chart's geometry, in pixels.
const (
	chartWidth  = 1000
	titleHeight = 34  // the chart's title line
	panelHeight = 240 // one strategy: its title and legend, plot area, x tick labels
	headerRoom  = 24  // above a plot area, for its title and legend
	tickRoom    = 24  // under a plot area, for the x tick labels
	xLabelRoom  = 22  // under the last panel, for the x axis label
	plotLeft    = 66  // left of the plot areas, for the y axis label and ticks
	plotRight   = 24
)

// chartHeight is the height of a chart of n panels.
func chartHeight(n int) int { return titleHeight + n*panelHeight + xLabelRoom }

// plotArea is where panel i draws its data.
func plotArea(i int) image.Rectangle {
	y := titleHeight + i*panelHeight
	return image.Rect(plotLeft, y+headerRoom, chartWidth-plotRight, y+panelHeight-tickRoom)
}

// axes maps seconds since the start (0 to xMax) and calls per second
// (0 to yMax) to the pixels of a plot area.
type axes struct {
	r          image.Rectangle
	xMax, yMax float64
}

func (a axes) px(x float64) int {
	return a.r.Min.X + int(math.Round(x/a.xMax*float64(a.r.Dx()-1)))
}

func (a axes) py(y float64) int {
	return a.r.Max.Y - 1 - int(math.Round(y/a.yMax*float64(a.r.Dy()-1)))
}

// writePlot charts the outage run to a PNG file: one panel per strategy,
// one above the other on the same axes, with the admitted and failed calls
// per second over time, the limit, and the outage shaded.
func writePlot(path string, tl *timeline, end time.Duration, limit tierlimit.Limit, strategies []string) error {
	img := drawChart(tl, end, limit, strategies)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// drawChart draws the chart that writePlot writes.
func drawChart(tl *timeline, end time.Duration, limit tierlimit.Limit, strategies []string) *image.RGBA {
	bins := int(end / tl.bin) // whole bins only: the last one may be cut short
	perSecond := float64(limit.Rate) / limit.Period.Seconds()
	top := perSecond
	for _, name := range strategies {
		s := tl.series[name]
		for b := range bins {
			top = max(top, float64(s.admitted[b].Load())/tl.bin.Seconds(), float64(s.errors[b].Load())/tl.bin.Seconds())
		}
	}
	yTicks := roundTicks(top * 1.08)
	a := axes{xMax: end.Seconds(), yMax: yTicks[len(yTicks)-1]}
	down, up := tl.changedAt(phaseDown).Seconds(), tl.changedAt(phaseAfter).Seconds()

	img := image.NewRGBA(image.Rect(0, 0, chartWidth, chartHeight(len(strategies))))
	fill(img, img.Bounds(), img.Bounds(), color.White)
	// basicfont has ASCII only: "2x", not "2×".
	title := fmt.Sprintf("%d instances per strategy share %v on one hot key, offered %dx; Redis killed at %.1fs, restarted empty at %.1fs",
		demoInstances, limit, offeredFactor, down, up)
	x := (chartWidth - textWidth(title)) / 2
	text(img, x, titleHeight-12, title, color.Black)
	text(img, x+1, titleHeight-12, title, color.Black) // bold
	for i, name := range strategies {
		a.r = plotArea(i)
		s := tl.series[name]
		admitted, failed := make([]float64, bins), make([]float64, bins)
		for b := range bins {
			admitted[b] = float64(s.admitted[b].Load()) / tl.bin.Seconds()
			failed[b] = float64(s.errors[b].Load()) / tl.bin.Seconds()
		}
		header := fmt.Sprintf("%s: %s errors while Redis was down", name, count(s.errs[phaseDown].Load()))
		drawPanel(img, a, header, yTicks, down, up, perSecond, admitted, failed, tl.bin.Seconds())
	}
	label := "time since the start of the run"
	text(img, a.r.Min.X+(a.r.Dx()-textWidth(label))/2, img.Bounds().Max.Y-8, label, color.Black)
	return img
}

// drawPanel draws one strategy's panel into a.r and around it: admitted
// and failed are rates per bin of bin seconds, down and up the outage.
func drawPanel(img *image.RGBA, a axes, header string, yTicks []float64, down, up, limit float64, admitted, failed []float64, bin float64) {
	r := a.r
	fill(img, image.Rect(a.px(down), r.Min.Y, a.px(up)+1, r.Max.Y), r, outageColor)
	for _, x := range secondTicks(a.xMax) {
		fill(img, image.Rect(a.px(x), r.Min.Y, a.px(x)+1, r.Max.Y), r, gridColor)
		fill(img, image.Rect(a.px(x), r.Max.Y, a.px(x)+1, r.Max.Y+5), img.Bounds(), color.Black)
		l := strconv.FormatFloat(x, 'f', -1, 64) + "s"
		text(img, a.px(x)-textWidth(l)/2, r.Max.Y+18, l, color.Black)
	}
	for _, y := range yTicks {
		fill(img, image.Rect(r.Min.X, a.py(y), r.Max.X, a.py(y)+1), r, gridColor)
		fill(img, image.Rect(r.Min.X-5, a.py(y), r.Min.X, a.py(y)+1), img.Bounds(), color.Black)
		l := strconv.FormatFloat(y, 'f', -1, 64)
		text(img, r.Min.X-8-textWidth(l), a.py(y)+5, l, color.Black)
	}
	fill(img, image.Rect(r.Min.X-1, r.Min.Y, r.Min.X, r.Max.Y+1), img.Bounds(), color.Black)
	fill(img, image.Rect(r.Min.X-1, r.Max.Y, r.Max.X, r.Max.Y+1), img.Bounds(), color.Black)
	textUp(img, 6, (r.Min.Y+r.Max.Y)/2, "calls per second", color.Black)

	dashes(img, r.Min.X, r.Max.X, a.py(limit), r, limitColor)
	// Steps, one per bin: a rate is known per bin, not at a point.
	legend := []legendEntry{{"Redis down", outageColor, swatchArea}, {"limit", limitColor, swatchDashed}}
	for _, v := range failed {
		if v > 0 {
			steps(img, a, failed, bin, errorColor)
			legend = append(legend, legendEntry{"errors/s", errorColor, swatchLine})
			break
		}
	}
	steps(img, a, admitted, bin, admittedColor)
	legend = append(legend, legendEntry{"admitted/s", admittedColor, swatchLine})

	text(img, r.Min.X, r.Min.Y-8, header, color.Black)
	drawLegend(img, r.Max.X, r.Min.Y-8, legend)
}

// steps draws v, one value per bin of w seconds, as a 2-pixel step line.
func steps(img *image.RGBA, a axes, v []float64, w float64, c color.Color) {
	for b, y := range v {
		x0, x1, py := a.px(float64(b)*w), a.px(float64(b+1)*w), a.py(y)
		fill(img, image.Rect(x0, py-1, x1+1, py+1), a.r, c)
		if b+1 < len(v) {
			next := a.py(v[b+1])
			fill(img, image.Rect(x1-1, min(py, next)-1, x1+1, max(py, next)+1), a.r, c)
		}
	}
}

// dashes draws a 2-pixel dashed line from x0 to x1 at y.
func dashes(img *image.RGBA, x0, x1, y int, clip image.Rectangle, c color.Color) {
	for x := x0; x < x1; x += 12 {
		fill(img, image.Rect(x, y-1, min(x+7, x1), y+1), clip, c)
	}
}

// legendEntry names what is drawn in colour c, as swatch shows it.
type legendEntry struct {
	name   string
	c      color.Color
	swatch int
}

// Legend swatches.
const (
	swatchArea = iota
	swatchDashed
	swatchLine
)

// drawLegend draws the entries in a row that ends at x, on baseline y.
func drawLegend(img *image.RGBA, x, y int, entries []legendEntry) {
	const w, gap = 22, 18
	for _, e := range entries {
		x -= gap + w + 5 + textWidth(e.name)
	}
	for _, e := range entries {
		x += gap
		switch e.swatch {
		case swatchArea:
			fill(img, image.Rect(x, y-10, x+w, y+1), img.Bounds(), e.c)
		case swatchDashed:
			dashes(img, x, x+w, y-4, img.Bounds(), e.c)
		default:
			fill(img, image.Rect(x, y-5, x+w, y-3), img.Bounds(), e.c)
		}
		text(img, x+w+5, y, e.name, color.Black)
		x += w + 5 + textWidth(e.name)
	}
}

// fill paints the part of r inside clip in c.
func fill(img *image.RGBA, r, clip image.Rectangle, c color.Color) {
	draw.Draw(img, r.Intersect(clip), image.NewUniform(c), image.Point{}, draw.Src)
}

// text draws s in c, its baseline starting at (x, y).
func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// textWidth is the width of s drawn by text, in pixels.
func textWidth(s string) int { return font.MeasureString(basicfont.Face7x13, s).Ceil() }

// textUp draws s in c reading upwards, centred on y, the tops of its
// letters at x.
func textUp(img *image.RGBA, x, y int, s string, c color.Color) {
	w, h := textWidth(s), basicfont.Face7x13.Height
	flat := image.NewRGBA(image.Rect(0, 0, w, h))
	text(flat, 0, basicfont.Face7x13.Ascent, s, c)
	for i := range w {
		for j := range h {
			if p := flat.RGBAAt(i, j); p.A > 0 {
				img.SetRGBA(x+j, y+w/2-i, p)
			}
		}
	}
}

// secondTicks returns where to mark an axis of 0 to end seconds: whole
// seconds, every 1, 2, 5, 10… seconds so that at most about a dozen
// labels show.
func secondTicks(end float64) []float64 {
	var step float64
	for _, step = range []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600} {
		if end/step <= 12 {
			break
		}
	}
	var ticks []float64
	for x := 0.0; x <= end; x += step {
		ticks = append(ticks, x)
	}
	return ticks
}

// roundTicks returns where to mark an axis of calls per second that must
// reach top: from 0, in at most 6 equal steps of 1, 2 or 5 times a power
// of ten (at least 1). The last tick is the axis's top.
func roundTicks(top float64) []float64 {
	top = max(top, 1)
	mag := max(1, math.Pow(10, math.Floor(math.Log10(top/6))))
	var step float64
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * mag; math.Ceil(top/step) <= 6 {
			break
		}
	}
	ticks := make([]float64, int(math.Ceil(top/step))+1)
	for i := range ticks {
		ticks[i] = float64(i) * step
	}
	return ticks
}
