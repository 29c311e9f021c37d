package local

import (
	"context"
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit/internal/permit/permittest"
)

func TestPermitRelease(t *testing.T) {
	c, err := NewConcurrency(1)
	if err != nil {
		t.Fatal(err)
	}
	permittest.Release(t, c, "k")
}

// TestPermitCopiesRace: copies of permits released at once from several
// goroutines give back each permit once, whatever else is acquired
// meanwhile.
func TestPermitCopiesRace(t *testing.T) {
	ctx := context.Background()
	const n = 4
	c, _ := NewConcurrency(n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				p, ok, err := c.TryAcquire(ctx, "k")
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				var rel sync.WaitGroup
				for range 3 {
					rel.Add(1)
					go func() { defer rel.Done(); p.Release() }()
				}
				rel.Wait()
			}
		}()
	}
	wg.Wait()
	if st := c.Stats(); st.InUse != 0 {
		t.Errorf("Stats().InUse = %d after every permit was released, want 0", st.InUse)
	}
	for i := range n {
		if _, ok, _ := c.TryAcquire(ctx, "k"); !ok {
			t.Fatalf("TryAcquire #%d after every release = false, want true (%d permits)", i+1, n)
		}
	}
}

// TestPermitAllocs: a warm TryAcquire and Release allocate nothing.
func TestPermitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	c, _ := NewConcurrency(1)
	permittest.Allocs(t, c, "TryAcquire+Release")
}
