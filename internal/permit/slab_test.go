package permit

import (
	"math/rand/v2"
	"testing"
)

func TestPermitSlab(t *testing.T) {
	var s Slab[string]
	i, g := s.Put("a")
	if _, ok := s.Take(i, g+1); ok {
		t.Errorf("Take(%d, %d) of another generation = true, want false", i, g+1)
	}
	if v, ok := s.Take(i, g); !ok || v != "a" {
		t.Errorf("Take(%d, %d) = %q, %v; want a, true", i, g, v, ok)
	}
	if _, ok := s.Take(i, g); ok {
		t.Errorf("second Take(%d, %d) = true, want false", i, g)
	}
	j, h := s.Put("b")
	if j != i || h == g {
		t.Errorf("Put after Take = %d, %d; want index %d reused with a generation not %d", j, h, i, g)
	}
	if _, ok := s.Take(i, g); ok {
		t.Errorf("stale Take(%d, %d) = true, want false: it freed the next holder's record", i, g)
	}
	if _, ok := s.Take(j, h); !ok {
		t.Errorf("Take(%d, %d) = false, want true", j, h)
	}
	if _, ok := s.Take(99, 1); ok {
		t.Error("Take of an index never given = true, want false")
	}
}

// TestPermitSlabBounded: the records follow the permits out, down as well as up,
// and generations never repeat across records dropped and made again.
func TestPermitSlabBounded(t *testing.T) {
	var s Slab[int]
	type rec struct {
		i uint32
		g uint64
	}
	seen := map[rec]bool{}
	const peak = 10_000
	rng := rand.New(rand.NewPCG(1, 2))
	var out []rec
	for range 3 {
		for v := range peak {
			i, g := s.Put(v)
			if seen[rec{i, g}] {
				t.Fatalf("Put gave index %d generation %d twice", i, g)
			}
			seen[rec{i, g}] = true
			out = append(out, rec{i, g})
		}
		if s.Len() != peak {
			t.Fatalf("Len() with %d out = %d, want %d", peak, s.Len(), peak)
		}
		// Release all but the first 10, in a random order.
		for _, k := range rng.Perm(len(out) - 10) {
			r := out[10+k]
			if _, ok := s.Take(r.i, r.g); !ok {
				t.Fatalf("Take(%d, %d) of a record out = false", r.i, r.g)
			}
		}
		out = out[:10]
		if s.Len() > 10 || cap(s.recs) > slabMin {
			t.Fatalf("with 10 out: Len() = %d, cap %d; want at most 10 and %d", s.Len(), cap(s.recs), slabMin)
		}
		for _, r := range out {
			if _, ok := s.Take(r.i, r.g); !ok {
				t.Fatalf("Take(%d, %d) of a record out = false", r.i, r.g)
			}
		}
		out = out[:0]
		if s.Len() != 0 || len(s.free) != 0 {
			t.Fatalf("with none out: Len() = %d, %d free; want 0, 0", s.Len(), len(s.free))
		}
	}
}
