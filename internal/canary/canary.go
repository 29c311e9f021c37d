// Package canary measures how late this process runs a goroutine that
// asks to wake at a time: the scheduling delay a real-time test must allow
// besides the bound it checks, measured on the machine the test runs on
// and while the test runs, rather than assumed from an idle one.
package canary

import (
	"sync/atomic"
	"time"
)

// tick is how often the canary asks to wake.
const tick = time.Millisecond

// Canary is a goroutine that sleeps a tick at a time and records the worst
// lateness of its wake-ups. It is safe for concurrent use.
type Canary struct {
	worst atomic.Int64 // ns, since the last Reset
	stop  chan struct{}
	done  chan struct{}
}

// Start starts a canary; Stop ends it.
func Start() *Canary {
	c := &Canary{stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *Canary) run() {
	defer close(c.done)
	t := time.NewTimer(tick)
	defer t.Stop()
	want := time.Now().Add(tick)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			if late := int64(time.Since(want)); late > c.worst.Load() {
				c.worst.Store(late)
			}
			want = time.Now().Add(tick)
			t.Reset(tick)
		}
	}
}

// Reset forgets the lateness seen so far.
func (c *Canary) Reset() { c.worst.Store(0) }

// Worst returns the worst lateness since Start or the last Reset.
func (c *Canary) Worst() time.Duration { return time.Duration(c.worst.Load()) }

// Stop ends the canary's goroutine and waits for it.
func (c *Canary) Stop() {
	close(c.stop)
	<-c.done
}
