package front

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestNewSizes(t *testing.T) {
	for _, tc := range []struct {
		maxKeys int64
		want    int // slots
	}{{1, 64}, {16, 64}, {17, 128}, {10_000, 65536}, {100_000, 65536}} {
		if got := New[int](tc.maxKeys).Len(); got != tc.want {
			t.Errorf("New(%d).Len() = %d, want %d", tc.maxKeys, got, tc.want)
		}
	}
}

func TestSetIsOneLine(t *testing.T) {
	if got := unsafe.Sizeof(Set[int]{}); got != 64 {
		t.Errorf("a Set takes %d bytes, want 64 (one cache line)", got)
	}
}

// find is how local and hybrid look a key up: the slot of its tag whose
// entry has its key.
func find(tb *Table[string], h uint64, key string) *string {
	s, tag := tb.Set(h)
	for i := range Ways {
		if e := s.Load(i, tag); e != nil && *e == key {
			return e
		}
	}
	return nil
}

func TestSetMasksHash(t *testing.T) {
	tb := New[string](16) // 16 sets
	a := "a"
	s, tag := tb.Set(3)
	s.Store(tag, &a)
	if got := find(tb, 3+16, "a"); got != &a {
		t.Errorf("hash 19 found %p, want the entry stored for hash 3, %p", got, &a)
	}
	if got := find(tb, 3|1<<40, "a"); got != nil {
		t.Errorf("another tag found %p, want nil", got)
	}
	if got := find(tb, 4, "a"); got != nil {
		t.Errorf("another set found %p, want nil", got)
	}
}

// TestWaysKeepKeysOfOneSet: Ways keys of one set are all found; one more
// takes one slot, and a key stored again takes its own slot back.
func TestWaysKeepKeysOfOneSet(t *testing.T) {
	tb := New[string](16)
	keys := []string{"a", "b", "c", "d", "e"}
	hash := func(i int) uint64 { return uint64(2*i+1)<<32 | 5 } // set 5, tags 1, 3, 5 ...
	for i := range Ways {
		s, tag := tb.Set(hash(i))
		s.Store(tag, &keys[i])
	}
	for i := range Ways {
		if got := find(tb, hash(i), keys[i]); got != &keys[i] {
			t.Errorf("key %q: found %p, want %p", keys[i], got, &keys[i])
		}
	}
	s, tag := tb.Set(hash(Ways))
	s.Store(tag, &keys[Ways])
	found := 0
	for i := range Ways + 1 {
		if find(tb, hash(i), keys[i]) != nil {
			found++
		}
	}
	if found != Ways {
		t.Errorf("after a fifth key, %d keys found, want %d", found, Ways)
	}
	again := "a2" // a new entry of the same hash as "a"
	s, tag = tb.Set(hash(0))
	s.Store(tag, &again)
	n := 0
	for i := range Ways {
		if s.Load(i, tag) != nil {
			n++
		}
	}
	if n != 1 {
		t.Errorf("tag of %q in %d slots, want 1: a store of a tag reuses its slot", "a", n)
	}
}

// TestConcurrentStores: readers racing stores into one set find only
// entries of their key (the caller's check) and never a torn slot.
func TestConcurrentStores(t *testing.T) {
	tb := New[string](16)
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = string(rune('a' + i))
	}
	hash := func(i int) uint64 { return uint64(i+1)<<32 | 7 }
	var wrong atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for n := range 20_000 {
				i := (n + w) % len(keys)
				if e := find(tb, hash(i), keys[i]); e == nil {
					s, tag := tb.Set(hash(i))
					s.Store(tag, &keys[i])
				} else if e != &keys[i] {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := wrong.Load(); n != 0 {
		t.Errorf("%d lookups found another key's entry", n)
	}
}

func TestSampledOnePerSampleEvery(t *testing.T) {
	// A binomial draw of mean 1000 and deviation 31: the bounds are six
	// deviations off, and a Sampled always or never true is far outside.
	const hits, want = 1000 * SampleEvery, 1000
	n := 0
	for range hits {
		if Sampled() {
			n++
		}
	}
	if n < want-200 || n > want+200 {
		t.Errorf("Sampled over %d hits = true %d times, want about %d", hits, n, want)
	}
}

// TestHashSpreads: keys that differ in a digit land in sets as a random
// function would put them (1 - 1/e of the sets hold one of as many keys as
// sets), and a key hashes the same each time.
func TestHashSpreads(t *testing.T) {
	tb := New[int](maxSets)
	used := make(map[*Set[int]]bool)
	for i := range maxSets {
		key := "key-" + strconv.Itoa(i)
		h := Hash(key)
		if again := Hash(key); again != h {
			t.Fatalf("Hash(%q) = %x, then %x", key, h, again)
		}
		s, _ := tb.Set(h)
		used[s] = true
	}
	if got, want := len(used), maxSets*6/10; got < want {
		t.Errorf("%d keys used %d of %d sets, want at least %d", maxSets, got, maxSets, want)
	}
}
