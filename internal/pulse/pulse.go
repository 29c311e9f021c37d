// Package pulse measures the time this process could not run its
// goroutines: a CPU starved by other processes, a stop-the-world pause, a
// suspended VM. A goroutine beats every Period while a user needs it and
// counts every beat later than two periods as time lost. hybrid subtracts
// what was lost during a call from the call's silence: a starved process
// whose timers fire before it reads Redis's replies must not take its own
// stall for Redis's (G1: a breaker that opens while Redis answers lets the
// fallback admit beside the leases).
package pulse

import (
	"sync"
	"time"
)

// Period is how often the beat runs: 200 wake-ups a second, and a
// resolution well below the stalls it corrects (several call budgets).
const Period = 5 * time.Millisecond

var beat struct {
	mu    sync.Mutex // users, stop, done
	users int
	stop  chan struct{}
	done  chan struct{}

	clock sync.Mutex // last and lost, read together
	last  int64      // ns of the last beat, 0 when none runs
	lost  int64      // ns lost so far: beats that came more than a period late
}

// Start counts a user of the beat, starting it for the first. Each Start
// needs a Stop.
func Start() {
	beat.mu.Lock()
	defer beat.mu.Unlock()
	beat.users++
	if beat.users > 1 {
		return
	}
	beat.stop, beat.done = make(chan struct{}), make(chan struct{})
	beat.clock.Lock()
	beat.last = time.Now().UnixNano()
	beat.clock.Unlock()
	go run(beat.stop, beat.done)
}

// Stop ends a user of the beat; the last one's Stop returns once the beat
// has stopped.
func Stop() {
	beat.mu.Lock()
	defer beat.mu.Unlock()
	if beat.users == 0 {
		return
	}
	beat.users--
	if beat.users > 0 {
		return
	}
	close(beat.stop)
	<-beat.done
	beat.clock.Lock()
	beat.last = 0
	beat.clock.Unlock()
}

func run(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(Period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			beat.clock.Lock()
			now := time.Now().UnixNano() // under the lock: Lost's readings then order with it
			if late := now - beat.last - int64(Period); late > int64(Period) {
				beat.lost += late
			}
			beat.last = now
			beat.clock.Unlock()
		}
	}
}

// Lost returns the time the process has lost so far, a clock that only
// moves forward: what it lost during an interval is the difference of
// two readings. It counts a beat late now, before the beat itself has run
// again (the caller may run first when the process gets the CPU back).
// Without a beat running it does not move.
func Lost() time.Duration {
	beat.clock.Lock()
	defer beat.clock.Unlock()
	now := time.Now().UnixNano()
	lost := beat.lost
	if beat.last != 0 {
		if late := now - beat.last - int64(Period); late > int64(Period) {
			lost += late
		}
	}
	return time.Duration(lost)
}
