package histogram

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	for _, ns := range []uint64{0, 1, 3, 4, 5, 7, 8, 15, 16, 17, 1000, 1023, 1024, 1999, 2000, 1 << 40, 1<<62 + 12345, 1<<64 - 1} {
		i := bucketOf(ns)
		if i < 0 || i >= buckets || bucketLow(i) > ns || (i+1 < buckets && bucketLow(i+1) <= ns) {
			t.Errorf("bucketOf(%d) = %d: [%d, %d) does not hold it", ns, i, bucketLow(i), bucketLow(i+1))
		}
		if i+1 < buckets && float64(bucketLow(i+1)) > 1.125*float64(ns)+1 {
			t.Errorf("bucketOf(%d) = %d, top %d: want within 12.5%%", ns, i, bucketLow(i+1))
		}
	}
}

func TestQuantile(t *testing.T) {
	var h Histogram
	if got, bound := h.Quantile(0.5), h.Bound(0.5); got != 0 || bound != 0 {
		t.Errorf("empty Quantile(0.5), Bound(0.5) = %v, %v; want 0, 0", got, bound)
	}
	for i := 1; i <= 1000; i++ {
		h.Add(time.Duration(i) * time.Microsecond)
	}
	if h.Count() != 1000 {
		t.Errorf("Count() = %d, want 1000", h.Count())
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {0, time.Microsecond}, {1, time.Millisecond}} {
		got := h.Quantile(tc.q)
		if diff := float64(got-tc.want) / float64(tc.want); diff < -0.125 || diff > 0.125 {
			t.Errorf("Quantile(%v) = %v, want %v within 12.5%%", tc.q, got, tc.want)
		}
		if b := h.Bound(tc.q); b <= tc.want || float64(b) > 1.125*float64(tc.want) {
			t.Errorf("Bound(%v) = %v, want above %v, within 12.5%%", tc.q, b, tc.want)
		}
	}
	var top Histogram
	top.Add(math.MaxInt64)
	if b := top.Bound(1); b != math.MaxInt64 {
		t.Errorf("Bound(1) of the longest latency = %v, want %v", b, time.Duration(math.MaxInt64))
	}
}

func TestMergeAndJSON(t *testing.T) {
	var a, b Histogram
	for i := 1; i <= 500; i++ {
		a.Add(time.Duration(i) * time.Microsecond)
		b.Add(time.Duration(500+i) * time.Microsecond)
	}
	a.Merge(&b)
	// By value in a struct, as the fault tests' child processes send theirs.
	out, err := json.Marshal(struct{ H [2]Histogram }{[2]Histogram{a, {}}})
	if err != nil {
		t.Fatal(err)
	}
	var in struct{ H [2]Histogram }
	if err := json.Unmarshal(out, &in); err != nil {
		t.Fatal(err)
	}
	if in.H[0] != a || in.H[1].Count() != 0 {
		t.Errorf("a histogram through JSON (%s) = %d samples, p99 %v; want %d, %v", out, in.H[0].Count(), in.H[0].Quantile(0.99), a.Count(), a.Quantile(0.99))
	}
	if err := json.Unmarshal(make([]byte, 0), &in.H[0]); err == nil {
		t.Error("Unmarshal of nothing = nil, want an error")
	}
}
