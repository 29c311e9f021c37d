// Package stat holds the arithmetic the bench commands share.
package stat

import "slices"

// Median returns the median of vs (the mean of the middle two when their
// number is even); ok is false when vs is empty. vs is not modified.
func Median(vs []float64) (m float64, ok bool) {
	if len(vs) == 0 {
		return 0, false
	}
	vs = slices.Sorted(slices.Values(vs))
	h := len(vs) / 2
	if len(vs)%2 == 1 {
		return vs[h], true
	}
	return (vs[h-1] + vs[h]) / 2, true
}
