package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Colours of the chart.
var (
	admittedColor = color.RGBA{R: 0x1f, G: 0x4e, B: 0x9c, A: 0xff}
	errorColor    = color.RGBA{R: 0xd0, G: 0x1c, B: 0x1c, A: 0xff}
	limitColor    = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	outageColor   = color.RGBA{R: 0xff, G: 0xd8, B: 0xa8, A: 0xff}
)

// writePlot charts the outage run to a PNG file: one panel per strategy,
// one above the other on the same axes, with the admitted and failed calls
// per second over time, the limit, and the outage shaded.
func writePlot(path string, tl *timeline, end time.Duration, limit tierlimit.Limit, strategies []string) error {
	bins := int(end / tl.bin) // whole bins only: the last one may be cut short
	perSecond := float64(limit.Rate) / limit.Period.Seconds()
	top := perSecond
	for _, name := range strategies {
		s := tl.series[name]
		for b := range bins {
			top = max(top, float64(s.admitted[b].Load())/tl.bin.Seconds(), float64(s.errors[b].Load())/tl.bin.Seconds())
		}
	}
	top *= 1.5 // room for the legend above the lines
	down, up := tl.changedAt(phaseDown).Seconds(), tl.changedAt(phaseAfter).Seconds()

	plots := make([][]*plot.Plot, len(strategies))
	for i, name := range strategies {
		p, err := panel(tl, name, bins, down, up, end.Seconds(), top, perSecond)
		if err != nil {
			return err
		}
		p.Legend.Top, p.Legend.Left = true, false
		if i < len(strategies)-1 {
			p.X.Label.Text = ""
		}
		plots[i] = []*plot.Plot{p}
	}

	const titleRoom = 34
	width, height := 10*vg.Inch, vg.Length(len(strategies))*2.3*vg.Inch+titleRoom
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))
	dc := draw.New(img)
	title := fmt.Sprintf("%d instances per strategy share %v on one hot key, offered %d×; Redis killed at %.1fs, restarted empty at %.1fs",
		demoInstances, limit, offeredFactor, down, up)
	font := plot.DefaultFont
	font.Size = vg.Points(13)
	sty := draw.TextStyle{Color: color.Black, Font: font, Handler: plot.DefaultTextHandler, XAlign: draw.XCenter}
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - titleRoom*0.75}, title)
	dc.Max.Y -= titleRoom
	tiles := draw.Tiles{Rows: len(strategies), Cols: 1, PadY: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(14), PadBottom: vg.Points(4)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
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

// panel is one strategy's chart.
func panel(tl *timeline, name string, bins int, down, up, end, top, limit float64) (*plot.Plot, error) {
	s := tl.series[name]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s errors while Redis was down", name, count(s.errs[phaseDown].Load()))
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = "time since the start of the run"
	p.Y.Label.Text = "calls per second"
	p.X.Min, p.X.Max = 0, end
	p.Y.Min, p.Y.Max = 0, top
	shade, err := plotter.NewPolygon(plotter.XYs{{X: down, Y: 0}, {X: up, Y: 0}, {X: up, Y: top}, {X: down, Y: top}})
	if err != nil {
		return nil, err
	}
	shade.Color, shade.LineStyle.Width = outageColor, 0
	p.Add(shade, plotter.NewGrid())
	p.Legend.Add("Redis down", shade)
	p.X.Tick.Marker = secondTicks{}

	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: limit}, {X: end, Y: limit}})
	if err != nil {
		return nil, err
	}
	lim.Color, lim.Width, lim.Dashes = limitColor, vg.Points(1.2), []vg.Length{vg.Points(6), vg.Points(4)}
	p.Add(lim)
	p.Legend.Add("limit", lim)

	// Steps, one per bin: a rate is known per bin, not at a point.
	admitted, failed := make(plotter.XYs, bins+1), make(plotter.XYs, bins+1)
	anyFailed := false
	for b := range bins + 1 {
		i := min(b, bins-1) // the last point closes the last step
		x := float64(b) * tl.bin.Seconds()
		admitted[b] = plotter.XY{X: x, Y: float64(s.admitted[i].Load()) / tl.bin.Seconds()}
		failed[b] = plotter.XY{X: x, Y: float64(s.errors[i].Load()) / tl.bin.Seconds()}
		anyFailed = anyFailed || failed[b].Y > 0
	}
	if anyFailed {
		l, err := plotter.NewLine(failed)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.StepStyle = errorColor, vg.Points(2), plotter.PostStep
		p.Add(l)
		p.Legend.Add("errors/s", l)
	}
	l, err := plotter.NewLine(admitted)
	if err != nil {
		return nil, err
	}
	l.Color, l.Width, l.StepStyle = admittedColor, vg.Points(2.2), plotter.PostStep
	p.Add(l)
	p.Legend.Add("admitted/s", l)
	return p, nil
}

// secondTicks marks whole seconds, labelled every 1, 2, 5, 10… seconds so
// that at most about a dozen labels show.
type secondTicks struct{}

// Ticks returns the ticks between min and max.
func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
	for _, s := range []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600} {
		step = s
		if (hi-lo)/s <= 12 {
			break
		}
	}
	var ticks []plot.Tick
	for x := math.Ceil(lo/step) * step; x <= hi; x += step {
		ticks = append(ticks, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'f', -1, 64) + "s"})
	}
	return ticks
}
