// Package front is the table of recently used entries that local and
// hybrid put before their ristretto cache: a hit costs a hash and two
// atomic loads from one cache line instead of ristretto's Get, which
// hashes the key again, locks a shard of its map and records the use for
// its admission policy. ristretto still owns the entries (its admission
// policy and its memory bound); the front table only points to some of
// them, and its users check that an entry they find is still ristretto's
// and report a sample of the hits to ristretto (Sampled), so that its
// frequency sketch still sees which keys are used.
//
// The table is set-associative: a key's hash picks a set of Ways slots, one
// cache line, each with the entry's pointer and a tag of the hash, so that
// a lookup compares the key of the one entry whose tag matches, and keys
// that share a set do not take each other's slot (a direct-mapped table of
// 65,536 slots left 14% of 10,000 uniform keys sharing a slot with
// another, each of their calls then a ristretto Get).
package front

import (
	"hash/maphash"
	"math/rand/v2"
	"sync/atomic"
)

// Ways is the number of slots of a set.
const Ways = 4

// maxSets bounds a table: 16,384 sets of one 64-byte line, 1 MiB.
const maxSets = 1 << 14

// Table maps a key's hash to the entries last found for keys of that
// hash's set. It is safe for concurrent use and must not be copied.
type Table[E any] struct {
	sets []Set[E]
}

// Set is the slots of the keys whose hashes share their low bits. Its
// tags and entries are written without a lock, each atomically, so a
// reader may see a tag with another entry than the one it was written
// with: a tag only says which entry to check, and the caller checks the
// entry's key.
type Set[E any] struct {
	tags [Ways]atomic.Uint32
	ents [Ways]atomic.Pointer[E]
	_    [64 - Ways*4 - Ways*8]byte
}

// New returns a Table for a cache of maxKeys keys: the power of two at or
// above maxKeys sets (4 slots per key), from 16 up to 16,384.
func New[E any](maxKeys int64) *Table[E] {
	n := 16
	for int64(n) < maxKeys && n < maxSets {
		n *= 2
	}
	return &Table[E]{sets: make([]Set[E], n)}
}

// seed is Hash's seed: one per process.
var seed = maphash.MakeSeed()

// Hash returns the hash of key that Set takes, which its users also stripe
// their locks and counters by: the runtime's string hash (hash/maphash),
// which costs a decision less than xxhash did on short keys (bench/RESULTS.md,
// issue 28), seeded per process.
func Hash(key string) uint64 { return maphash.String(seed, key) }

// Set returns the set of hash h, and the tag of h in it.
func (t *Table[E]) Set(h uint64) (*Set[E], uint32) {
	return &t.sets[h&uint64(len(t.sets)-1)], uint32(h>>32) | 1
}

// Len returns the number of slots.
func (t *Table[E]) Len() int { return len(t.sets) * Ways }

// Load returns the entry of slot i if its tag is tag, else nil.
func (s *Set[E]) Load(i int, tag uint32) *E {
	if s.tags[i].Load() != tag {
		return nil
	}
	return s.ents[i].Load()
}

// Store puts e, whose key's hash has tag, in a slot of s: one of that tag
// (an earlier entry of the key, or of a key it collides with), else an
// empty one, else one chosen at random.
func (s *Set[E]) Store(tag uint32, e *E) {
	i := -1
	for j := range Ways {
		switch s.tags[j].Load() {
		case tag:
			i = j
		case 0:
			if i < 0 {
				i = j
			}
		}
	}
	if i < 0 {
		i = int(rand.Uint32N(Ways))
	}
	s.tags[i].Store(0) // no reader pairs the old tag with e
	s.ents[i].Store(e)
	s.tags[i].Store(tag)
}

// SampleEvery is how many of an entry's hits make one sampled use, on
// average: a ristretto Get misses the caches for several lines, so
// reporting many hits puts them back on the decision's path
// (BenchmarkComparePaired's profile, with one in 16, on many keys).
const SampleEvery = 64

// Sampled reports whether a hit is one that its user reports to ristretto
// (a Get of the key): one in SampleEvery at random, so that each key's
// reported uses follow its hits. It draws from the runtime's per-thread
// generator rather than count in the entry: a count is one more locked
// write to the entry's line on every hit, which the cores deciding one key
// in parallel pay for (bench/RESULTS.md, issue 28).
func Sampled() bool { return rand.Uint32()%SampleEvery == 0 }
