package main

import (
	"math/bits"
	"time"
)

// histogram counts latencies in log-linear buckets: exact below 16 ns, then
// eight buckets per power of two (within 12.5%). Adding is a few
// instructions and no allocation, so every sampled decision is recorded.
// The zero value is empty and ready; a histogram is not safe for concurrent
// use: each worker keeps its own and they are merged at the end.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
}

const (
	subBits     = 3                         // 2^subBits buckets per power of two
	histBuckets = (65 - subBits) << subBits // up to bucketOf(2^64-1)
)

func bucketOf(ns uint64) int {
	if ns < 2<<subBits {
		return int(ns)
	}
	shift := bits.Len64(ns) - subBits - 1
	return shift<<subBits + int(ns>>shift)
}

// bucketLow is the smallest latency of bucket i.
func bucketLow(i int) uint64 {
	if i < 2<<subBits {
		return uint64(i)
	}
	shift := i>>subBits - 1
	return uint64(i&(1<<subBits-1)|1<<subBits) << shift
}

func (h *histogram) add(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.n++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the latency below which a fraction q of the samples
// fall, as the middle of its bucket; 0 without samples.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo := bucketLow(i)
			if i+1 < histBuckets {
				return time.Duration(lo + (bucketLow(i+1)-lo)/2)
			}
			return time.Duration(lo)
		}
	}
	return 0
}
