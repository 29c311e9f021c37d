package gate

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestDrainGivesUp: Drain returns false once its wait has passed while a
// call is still inside, and true once the call has left.
func TestDrainGivesUp(t *testing.T) {
	var g Gate
	if !g.Enter(3) {
		t.Fatal("Enter on an open gate = false, want true")
	}
	if !g.Shut() {
		t.Fatal("the first Shut = false, want true")
	}
	if g.Shut() {
		t.Fatal("a second Shut = true, want false")
	}
	start := time.Now()
	if g.Drain(20 * time.Millisecond) {
		t.Fatal("Drain with a call inside = true, want false")
	}
	if took := time.Since(start); took < 20*time.Millisecond || took > 2*time.Second {
		t.Errorf("Drain(20ms) took %v, want 20ms or a little more", took)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		g.Exit(3)
	}()
	if !g.Drain(-1) {
		t.Error("Drain(-1) after the call left = false, want true")
	}
	if !g.Drain(0) {
		t.Error("Drain(0) with nothing inside = false, want true")
	}
}
