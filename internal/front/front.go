// Package front is the direct-mapped table of recently used entries that
// local and hybrid put before their ristretto cache: a hit costs a hash and
// an atomic load instead of ristretto's Get, which hashes the key again,
// locks a shard of its map and records the use for its admission policy.
// ristretto still owns the entries (its admission policy and its memory
// bound); the front table only points to some of them, and its users
// check that an entry they find is still ristretto's and report a sample
// of the hits to ristretto (Sampled), so that its frequency sketch still
// sees which keys are used.
package front

import "sync/atomic"

// maxSlots bounds a table (512 KiB of pointers). Keys that share a slot
// take it from each other, and each time the next call of the one that
// lost it goes to ristretto: BenchmarkCompare's 10,000 uniform keys miss
// in a quarter of their calls at 2^14 slots.
const maxSlots = 1 << 16

// Table maps a key's hash to the entry last found for a key of that hash.
// It is safe for concurrent use and must not be copied.
type Table[E any] struct {
	slots []atomic.Pointer[E]
}

// New returns a Table for a cache of maxKeys keys: the power of two at or
// above 4·maxKeys slots, from 64 up to 65,536.
func New[E any](maxKeys int64) *Table[E] {
	n := 64
	for int64(n) < 4*maxKeys && n < maxSlots {
		n *= 2
	}
	return &Table[E]{slots: make([]atomic.Pointer[E], n)}
}

// Slot returns the slot of hash h.
func (t *Table[E]) Slot(h uint64) *atomic.Pointer[E] { return &t.slots[h&uint64(len(t.slots)-1)] }

// Len returns the number of slots.
func (t *Table[E]) Len() int { return len(t.slots) }

// SampleEvery is how many of an entry's hits make one sampled use: a
// ristretto Get misses the caches for several lines, so reporting many hits
// puts them back on the decision's path (BenchmarkComparePaired's profile,
// with one in 16, on many keys).
const SampleEvery = 64

// Sampled counts a hit in uses, an entry's hit counter, and reports
// whether this hit is the one in SampleEvery that its user reports to
// ristretto (a Get of the key).
func Sampled(uses *atomic.Uint32) bool { return uses.Add(1)%SampleEvery == 0 }
