// Package histogram counts latencies in log-linear buckets, for the
// tierlimit command's measurements and the fault tests' latency bars: exact
// below 16 ns, then eight buckets per power of two, so a quantile is known
// within 12.5%. Adding is a few instructions and no allocation, so every
// sampled decision can be recorded.
package histogram

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"time"
)

const (
	subBits = 3                         // 2^subBits buckets per power of two
	buckets = (65 - subBits) << subBits // up to bucketOf(2^64-1)
)

// Histogram is a histogram of latencies. Its zero value is empty and ready
// to use. It is not safe for concurrent use (each worker keeps its own and
// they are merged at the end) and may be copied. It marshals to JSON as its
// counts, so that a child process can send one to its parent.
type Histogram struct {
	counts [buckets]uint64
	n      uint64
}

// bucketOf returns the bucket of a latency of ns.
func bucketOf(ns uint64) int {
	if ns < 2<<subBits {
		return int(ns)
	}
	shift := bits.Len64(ns) - subBits - 1
	return shift<<subBits + int(ns>>shift)
}

// bucketLow returns the smallest latency of bucket i.
func bucketLow(i int) uint64 {
	if i < 2<<subBits {
		return uint64(i)
	}
	shift := i>>subBits - 1
	return uint64(i&(1<<subBits-1)|1<<subBits) << shift
}

// Add counts d; a negative d counts as 0.
func (h *Histogram) Add(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.n++
}

// Merge adds o's counts to h's.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// Count returns the number of latencies counted.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the latency below which a fraction q of the samples
// fall, as the middle of its bucket (within 12.5%); 0 without samples.
func (h *Histogram) Quantile(q float64) time.Duration {
	i, ok := h.bucketAt(q)
	if !ok {
		return 0
	}
	lo := bucketLow(i)
	if i+1 < buckets {
		return time.Duration(lo + (bucketLow(i+1)-lo)/2)
	}
	return time.Duration(lo)
}

// Bound returns an upper bound of the q-quantile: the smallest latency
// above every one of its bucket (at most 12.5% above it), for a test that
// bars a quantile; 0 without samples.
func (h *Histogram) Bound(q float64) time.Duration {
	i, ok := h.bucketAt(q)
	if !ok {
		return 0
	}
	if i+1 == buckets || bucketLow(i+1) > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(bucketLow(i + 1))
}

// bucketAt returns the bucket of the q-quantile, and false without samples.
func (h *Histogram) bucketAt(q float64) (int, bool) {
	if h.n == 0 {
		return 0, false
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return i, true
		}
	}
	return buckets - 1, true
}

// MarshalJSON returns the counts up to the last bucket used, as a JSON
// array. Its receiver is a value, so that a Histogram held by value in a
// struct marshals so too.
func (h Histogram) MarshalJSON() ([]byte, error) {
	last := len(h.counts)
	for last > 0 && h.counts[last-1] == 0 {
		last--
	}
	return json.Marshal(h.counts[:last])
}

// UnmarshalJSON sets h to the counts of a JSON array that MarshalJSON made.
func (h *Histogram) UnmarshalJSON(b []byte) error {
	var counts []uint64
	if err := json.Unmarshal(b, &counts); err != nil {
		return err
	}
	if len(counts) > buckets {
		return fmt.Errorf("histogram: %d counts, want at most %d", len(counts), buckets)
	}
	*h = Histogram{}
	copy(h.counts[:], counts)
	for _, c := range counts {
		h.n += c
	}
	return nil
}
