package pulse

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/pulse/pulsetest"
)

// TestLostCountsAStop: a 300 ms stop of the whole process is counted lost,
// once the beat runs again and before it does.
func TestLostCountsAStop(t *testing.T) {
	Start()
	defer Stop()
	time.Sleep(3 * Period)
	before := Lost()
	pulsetest.StopSelf(t, 300*time.Millisecond)
	if got := Lost() - before; got < 250*time.Millisecond || got > 5*time.Second {
		t.Errorf("Lost moved %v over a 300 ms stop, read at once; want about 300 ms", got)
	}
	time.Sleep(3 * Period)
	if got := Lost() - before; got < 250*time.Millisecond || got > 5*time.Second {
		t.Errorf("Lost moved %v over a 300 ms stop, read after the beat; want about 300 ms", got)
	}
}

// TestLostNeverGoesBack reads Lost from several goroutines while the beat
// runs late and on time: every reading is at least the last.
func TestLostNeverGoesBack(t *testing.T) {
	Start()
	defer Stop()
	done := make(chan struct{})
	errs := make(chan string, 4)
	for range 4 {
		go func() {
			var last time.Duration
			for {
				select {
				case <-done:
					errs <- ""
					return
				default:
				}
				if got := Lost(); got < last {
					errs <- fmt.Sprintf("Lost went back from %v to %v", last, got)
					return
				} else {
					last = got
				}
			}
		}()
	}
	pulsetest.StopSelf(t, 50*time.Millisecond)
	time.Sleep(10 * Period)
	close(done)
	for range 4 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}

// TestStartStop: users nest, and the last Stop ends the beat's goroutine.
func TestStartStop(t *testing.T) {
	before := runtime.NumGoroutine()
	Start()
	Start()
	Stop()
	if beat.last == 0 {
		t.Fatal("the beat stopped with a user left")
	}
	Stop()
	Stop() // one too many: harmless
	for i := 0; runtime.NumGoroutine() > before && i < 100; i++ {
		time.Sleep(time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > before {
		t.Errorf("%d goroutines after the last Stop, want %d", got, before)
	}
}

// TestLostSince: what was lost since an instant before a 300 ms stop
// counts it; since an instant after, it does not.
func TestLostSince(t *testing.T) {
	Start()
	defer Stop()
	time.Sleep(3 * Period)
	before := time.Now()
	time.Sleep(3 * Period)
	pulsetest.StopSelf(t, 300*time.Millisecond)
	time.Sleep(3 * Period)
	after := time.Now()
	time.Sleep(3 * Period)
	if got := LostSince(before); got < 250*time.Millisecond || got > 5*time.Second {
		t.Errorf("LostSince(before the stop) = %v, want about 300 ms", got)
	}
	if got := LostSince(after); got > 100*time.Millisecond {
		t.Errorf("LostSince(after the stop) = %v, want about 0", got)
	}
}
