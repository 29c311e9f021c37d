package series

import (
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit"
)

func TestSet(t *testing.T) {
	var made []string
	s := &Set[string]{Max: 2, New: func(label string) string {
		made = append(made, label)
		return label
	}}
	for i, tc := range []struct {
		limit        tierlimit.Limit
		want         string
		wantOverflow bool
	}{
		{tierlimit.PerSecond(1), "1/1s", false},
		{tierlimit.PerSecond(2), "2/1s", false},
		{tierlimit.PerSecond(1), "1/1s", false},
		{tierlimit.PerSecond(3), Other, true},
		{tierlimit.PerSecond(4), Other, false},
		{tierlimit.PerSecond(2), "2/1s", false},
	} {
		got, overflow := s.Get(tc.limit)
		if got != tc.want || overflow != tc.wantOverflow {
			t.Errorf("step %d: Get(%v) = %q, %v; want %q, %v", i, tc.limit, got, overflow, tc.want, tc.wantOverflow)
		}
	}
	if len(made) != 3 {
		t.Errorf("New called for %q, want once per label (3)", made)
	}
	ranged := map[string]string{}
	s.Range(func(label, series string) { ranged[label] = series })
	if len(ranged) != 3 || ranged["1/1s"] != "1/1s" || ranged["2/1s"] != "2/1s" || ranged[Other] != Other {
		t.Errorf("Range saw %v, want the 3 labels and their series", ranged)
	}
}

// TestSetBounded checks the bound under 10,000 distinct limits asked
// concurrently: Max labels and Other, each made once, one overflow.
func TestSetBounded(t *testing.T) {
	var mu sync.Mutex
	labels := map[string]int{}
	s := &Set[string]{Max: 32, New: func(label string) string {
		mu.Lock()
		labels[label]++
		mu.Unlock()
		return label
	}}
	var wg sync.WaitGroup
	var overflows sync.Map
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := int64(1); r <= 10_000; r++ {
				if _, o := s.Get(tierlimit.PerSecond(r)); o {
					overflows.Store(r, true)
				}
			}
		}()
	}
	wg.Wait()
	n := 0
	overflows.Range(func(any, any) bool { n++; return true })
	if len(labels) != 33 || labels[Other] != 1 || n != 1 {
		t.Errorf("%d labels (other made %d times), %d overflows; want 33, 1, 1", len(labels), labels[Other], n)
	}
	for l, c := range labels {
		if c != 1 {
			t.Errorf("label %q made %d times, want 1", l, c)
		}
	}
}
