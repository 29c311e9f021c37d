package gate

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestCloseWaitsForCallsInside: once Close returns, no call is inside and
// none gets in, whatever the calls racing it.
func TestCloseWaitsForCallsInside(t *testing.T) {
	for round := range 200 {
		var g Gate
		var inside, afterClose atomic.Int64
		var closed atomic.Bool
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 1000; i++ {
					h := uint64(w*1000 + i)
					if !g.Enter(h) {
						return
					}
					inside.Add(1)
					if closed.Load() {
						afterClose.Add(1)
					}
					inside.Add(-1)
					g.Exit(h)
				}
			}()
		}
		if !g.Close() {
			t.Fatalf("round %d: the first Close = false, want true", round)
		}
		closed.Store(true)
		if n := inside.Load(); n != 0 {
			t.Fatalf("round %d: %d calls inside after Close returned", round, n)
		}
		if g.Enter(1) {
			t.Fatalf("round %d: Enter after Close = true, want false", round)
		}
		wg.Wait()
		if n := afterClose.Load(); n != 0 {
			t.Fatalf("round %d: %d calls got in after Close returned", round, n)
		}
		if g.Close() {
			t.Fatalf("round %d: a second Close = true, want false", round)
		}
	}
}
