package front

import (
	"sync/atomic"
	"testing"
)

func TestNewSizes(t *testing.T) {
	for _, tc := range []struct {
		maxKeys int64
		want    int
	}{{1, 64}, {16, 64}, {17, 128}, {10_000, 65536}, {100_000, 65536}} {
		if got := New[int](tc.maxKeys).Len(); got != tc.want {
			t.Errorf("New(%d).Len() = %d, want %d", tc.maxKeys, got, tc.want)
		}
	}
}

func TestSlotMasksHash(t *testing.T) {
	tb := New[int](16) // 64 slots
	v := 7
	tb.Slot(3).Store(&v)
	if got := tb.Slot(3 + 64).Load(); got != &v {
		t.Errorf("Slot(67) = %p, want the entry stored in Slot(3), %p", got, &v)
	}
	if got := tb.Slot(4).Load(); got != nil {
		t.Errorf("Slot(4) = %p, want nil", got)
	}
}

func TestSampledOnePerSampleEvery(t *testing.T) {
	var uses atomic.Uint32
	n := 0
	for range 10 * SampleEvery {
		if Sampled(&uses) {
			n++
		}
	}
	if n != 10 {
		t.Errorf("Sampled over %d hits = true %d times, want 10", 10*SampleEvery, n)
	}
}
