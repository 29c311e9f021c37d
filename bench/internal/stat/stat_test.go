package stat

import "testing"

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		vs   []float64
		want float64
		ok   bool
	}{
		{nil, 0, false},
		{[]float64{3}, 3, true},
		{[]float64{4, 1, 3, 2}, 2.5, true},
		{[]float64{5, 1, 3}, 3, true},
	} {
		in := append([]float64(nil), tc.vs...)
		if got, ok := Median(tc.vs); got != tc.want || ok != tc.ok {
			t.Errorf("Median(%v) = %v, %v; want %v, %v", in, got, ok, tc.want, tc.ok)
		}
		for i := range in {
			if tc.vs[i] != in[i] {
				t.Errorf("Median(%v) reordered its input to %v", in, tc.vs)
			}
		}
	}
}
