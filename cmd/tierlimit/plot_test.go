package main

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// syntheticTimeline is an outage run of end: every strategy admits
// 1000/s, except while Redis is down, from 2 s to 4 s, when the
// strategies in failing admit nothing and fail that many calls per second.
func syntheticTimeline(end time.Duration, failing map[string]int64) *timeline {
	const bin = 100 * time.Millisecond
	tl := newTimeline(allStrategies, end, bin)
	tl.changes[phaseDown], tl.changes[phaseAfter] = 2*time.Second, 4*time.Second
	for _, name := range allStrategies {
		s := tl.series[name]
		for b := range s.admitted {
			at := time.Duration(b) * bin
			if n := failing[name]; n > 0 && at >= 2*time.Second && at < 4*time.Second {
				s.errors[b].Store(n / 10)
				s.errs[phaseDown].Add(n / 10)
				continue
			}
			s.admitted[b].Store(100)
		}
	}
	return tl
}

func TestWritePlot(t *testing.T) {
	const end = 6 * time.Second
	tests := []struct {
		name    string
		failing map[string]int64 // errors per second while Redis is down, by strategy
	}{
		{"remote strategies fail", map[string]int64{stratTB: 2000, stratGCRA: 2000}},
		{"one strategy fails", map[string]int64{stratHybrid: 500}},
		{"no errors", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "chart.png")
			if err := writePlot(path, syntheticTimeline(end, tt.failing), end, tierlimit.PerSecond(1000), allStrategies); err != nil {
				t.Fatalf("writePlot: %v", err)
			}
			img := decodePNG(t, path)
			if got, want := img.Bounds().Size(), image.Pt(chartWidth, chartHeight(len(allStrategies))); got != want {
				t.Fatalf("chart size = %v, want %v", got, want)
			}
			for i, name := range allStrategies {
				a := axes{r: plotArea(i), xMax: end.Seconds()}
				down, up := a.px(2), a.px(4)
				in := func(x, _ int) bool { return x >= down && x <= up }
				out := func(x, _ int) bool { return x < down || x > up }
				everywhere := func(int, int) bool { return true }
				checks := []struct {
					what  string
					c     color.RGBA
					where func(x, y int) bool
					want  bool
				}{
					{"outage shade inside the outage", outageColor, in, true},
					{"outage shade outside the outage", outageColor, out, false},
					{"admitted line", admittedColor, everywhere, true},
					{"error line", errorColor, everywhere, tt.failing[name] > 0},
				}
				for _, c := range checks {
					if got := hasColor(img, a.r, c.c, c.where); got != c.want {
						t.Errorf("panel %s: %s: found = %v, want %v", name, c.what, got, c.want)
					}
				}
			}
		})
	}
}

// decodePNG reads the PNG file at path.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return img
}

// hasColor reports whether a pixel of r for which where holds is c.
func hasColor(img image.Image, r image.Rectangle, c color.RGBA, where func(x, y int) bool) bool {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if where(x, y) && color.RGBAModel.Convert(img.At(x, y)) == c {
				return true
			}
		}
	}
	return false
}

func TestSecondTicks(t *testing.T) {
	tests := []struct {
		end  float64
		want []float64
	}{
		{0.5, []float64{0}},
		{4, []float64{0, 1, 2, 3, 4}},
		{4.9, []float64{0, 1, 2, 3, 4}},
		{12, []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{12.5, []float64{0, 2, 4, 6, 8, 10, 12}},
		{25, []float64{0, 5, 10, 15, 20, 25}},
		{200, []float64{0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200}},
		{3600, []float64{0, 300, 600, 900, 1200, 1500, 1800, 2100, 2400, 2700, 3000, 3300, 3600}},
	}
	for _, tt := range tests {
		if got := secondTicks(tt.end); !slices.Equal(got, tt.want) {
			t.Errorf("secondTicks(%v) = %v, want %v", tt.end, got, tt.want)
		}
	}
}

func TestRoundTicks(t *testing.T) {
	tests := []struct {
		top  float64
		want []float64
	}{
		{0, []float64{0, 1}},
		{1, []float64{0, 1}},
		{5.5, []float64{0, 1, 2, 3, 4, 5, 6}},
		{60, []float64{0, 10, 20, 30, 40, 50, 60}},
		{61, []float64{0, 20, 40, 60, 80}},
		{1080, []float64{0, 200, 400, 600, 800, 1000, 1200}},
		{2160, []float64{0, 500, 1000, 1500, 2000, 2500}},
		{3300, []float64{0, 1000, 2000, 3000, 4000}},
	}
	for _, tt := range tests {
		if got := roundTicks(tt.top); !slices.Equal(got, tt.want) {
			t.Errorf("roundTicks(%v) = %v, want %v", tt.top, got, tt.want)
		}
	}
}
