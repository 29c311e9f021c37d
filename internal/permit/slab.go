package permit

import "math"

// Slab holds the records of a limiter's permits out: each has an index
// (the permit's id, or part of it) and a generation, so that a permit
// released twice, or a copy released after its index went to another
// holder, finds a generation not its own and does nothing. Generations
// come from one counter per Slab, never reused, even across a record
// dropped and made again.
//
// Its memory follows the permits out: freed indexes are reused (last
// freed first), the records above the highest one out are dropped, and
// the array is reallocated smaller once under a quarter of it is used.
// So it never holds more records than the most permits out at once, and
// after a peak it shrinks as the highest indexes are released.
//
// The zero value is ready. A Slab is not safe for concurrent use: its
// owner's lock guards it. It must not be copied.
type Slab[T any] struct {
	recs []slabRecord[T]
	free []uint32 // indexes freed below the top; some may be stale (above it, or in use again)
	next uint64   // the last generation given
}

type slabRecord[T any] struct {
	gen uint64 // 0: free
	v   T
}

// slabMin is the array size below which a Slab does not shrink it.
const slabMin = 64

// Put stores v in a free record and returns its index and generation
// (never 0).
func (s *Slab[T]) Put(v T) (idx uint32, gen uint64) {
	s.next++
	for len(s.free) > 0 {
		i := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		if int(i) < len(s.recs) && s.recs[i].gen == 0 {
			s.recs[i] = slabRecord[T]{gen: s.next, v: v}
			return i, s.next
		}
	}
	s.recs = append(s.recs, slabRecord[T]{gen: s.next, v: v})
	return uint32(len(s.recs) - 1), s.next
}

// Take frees record idx and returns its value if gen is its generation;
// otherwise (released already, or never given) it returns ok false and
// changes nothing.
func (s *Slab[T]) Take(idx uint32, gen uint64) (v T, ok bool) {
	if int(idx) >= len(s.recs) || gen == 0 || s.recs[idx].gen != gen {
		return v, false
	}
	v = s.recs[idx].v
	s.recs[idx] = slabRecord[T]{}
	if int(idx) < len(s.recs)-1 {
		s.free = append(s.free, idx)
		return v, true
	}
	n := len(s.recs) - 1
	for n > 0 && s.recs[n-1].gen == 0 {
		n--
	}
	s.recs = s.recs[:n]
	if n == 0 {
		s.free = s.free[:0]
	}
	if c := cap(s.recs); c > slabMin && n < c/4 {
		s.recs = append(make([]slabRecord[T], 0, max(slabMin, 2*n)), s.recs...)
		if cap(s.free) > slabMin && len(s.free) < cap(s.free)/4 {
			s.free = append(make([]uint32, 0, max(slabMin, 2*len(s.free))), s.free...)
		}
	}
	return v, true
}

// TakeID is Take for a permit's whole id: one over 32 bits was never
// given, and takes nothing.
func (s *Slab[T]) TakeID(id, gen uint64) (v T, ok bool) {
	if id > math.MaxUint32 {
		return v, false
	}
	return s.Take(uint32(id), gen)
}

// Len returns the number of records, free ones below the top included.
func (s *Slab[T]) Len() int { return len(s.recs) }
