package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// number parses a table cell such as "1,234" or "0.0153".
func number(t *testing.T, cell string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(strings.ReplaceAll(cell, ",", ""), 64)
	if err != nil {
		t.Fatalf("cell %q is not a number", cell)
	}
	return v
}

// maxBreakerOpen bounds how long after the kill hybrid's breakers open in
// the demo. They open in about 20 ms (187 ms seen under -race beside other
// packages' tests); TestClientFailsFast checks the cause precisely.
const maxBreakerOpen = time.Second

// TestDemoShort runs the whole demo briefly on the embedded Redis and checks
// its promises: every strategy has a row, hybrid makes at most 1/20 of
// remote-tb's Redis calls per decision, and while Redis is down hybrid and
// local return no error and still admit, while the remote strategies
// report the failures.
func TestDemoShort(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "outage.png")
	args := []string{"demo", "-duration", "4s", "-plot", chart}
	code, stdout, stderr := runCmd(t, args...)
	if code != exitOK {
		t.Fatalf("run(%q) = %d, stderr %q", args, code, stderr)
	}

	rows := tableRows(stdout, "strategy     decisions/s")
	if len(rows) != len(allStrategies) {
		t.Fatalf("throughput table has %d rows, want %d:\n%s", len(rows), len(allStrategies), stdout)
	}
	calls := map[string]float64{}
	for i, r := range rows {
		if r[0] != allStrategies[i] || len(r) != 9 {
			t.Fatalf("throughput row %d = %q, want %s and 9 cells", i, r, allStrategies[i])
		}
		calls[r[0]] = number(t, r[4])
		if errs := number(t, r[8]); errs != 0 && (r[0] == stratLocal || r[0] == stratHybrid) {
			t.Errorf("%s: %v errors on a healthy Redis", r[0], errs)
		}
	}
	if calls[stratLocal] != 0 || calls[stratTB] < 999 || calls[stratHybrid]*20 > calls[stratTB] {
		t.Errorf("Redis calls per 1000 decisions: local %v, remote-tb %v, hybrid %v; want 0, about 1000 and at most 1/20 of remote-tb's",
			calls[stratLocal], calls[stratTB], calls[stratHybrid])
	}

	rows = tableRows(stdout, "strategy     admitted/s:")
	if len(rows) != len(allStrategies) {
		t.Fatalf("outage table has %d rows, want %d:\n%s", len(rows), len(allStrategies), stdout)
	}
	for i, r := range rows {
		if r[0] != allStrategies[i] || len(r) != 7 {
			t.Fatalf("outage row %d = %q, want %s and 7 cells", i, r, allStrategies[i])
		}
		admittedDown, errorsDown := number(t, r[2]), number(t, r[5])
		switch r[0] {
		case stratLocal, stratHybrid:
			if admittedDown == 0 || r[4] != "0" || r[5] != "0" || r[6] != "0" {
				t.Errorf("%s: %q: want admissions while Redis is down and no error at all", r[0], r)
			}
		default:
			if admittedDown != 0 || errorsDown == 0 {
				t.Errorf("%s: %q: want no admission and errors while Redis is down", r[0], r)
			}
		}
	}
	if !strings.Contains(stdout, "hybrid: no call failed") || !strings.Contains(stdout, "Chart of the outage run written to "+chart) {
		t.Errorf("demo output lacks the hybrid note or the chart's path:\n%s", stdout)
	}

	// Hybrid's breakers open soon after the kill.
	if _, rest, ok := strings.Cut(stdout, "Its circuit breakers opened within "); !ok {
		t.Errorf("demo output lacks the breakers' note:\n%s", stdout)
	} else if d, err := time.ParseDuration(strings.Fields(rest)[0]); err != nil || d > maxBreakerOpen {
		t.Errorf("hybrid's breakers opened %q after the kill, want within %v", strings.Fields(rest)[0], maxBreakerOpen)
	}

	f, err := os.Open(chart)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width < 800 || cfg.Height < 800 {
		t.Errorf("chart: %dx%d, %v; want a PNG of at least 800x800", cfg.Width, cfg.Height, err)
	}
}
