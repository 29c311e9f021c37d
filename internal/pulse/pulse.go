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

	clock sync.Mutex // last, lost and past, read together
	last  int64      // ns of the last beat, 0 when none runs
	lost  int64      // ns lost so far: beats that came more than a period late
	past  [history]sample
	next  int // past's slot for the next beat
}

// history is how many beats LostSince remembers: 5 s of them.
const history = 1024

// sample is a beat: its time and what was lost up to it.
type sample struct{ at, lost int64 }

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
			beat.lost += late(now)
			beat.last = now
			beat.past[beat.next] = sample{now, beat.lost}
			beat.next = (beat.next + 1) % history
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
	return lostNow()
}

// LostSince returns what the process has lost since t, as far as the
// last 5 s of beats tell (t older than that: since the oldest beat they
// remember).
func LostSince(t time.Time) time.Duration {
	at := t.UnixNano()
	beat.clock.Lock()
	defer beat.clock.Unlock()
	now := lostNow()
	// The latest beat at or before t, walking back from the newest.
	base := time.Duration(-1)
	for i := 1; i <= history; i++ {
		b := beat.past[(beat.next-i+history)%history]
		if b.at == 0 {
			break
		}
		base = time.Duration(b.lost)
		if b.at <= at {
			break
		}
	}
	if base < 0 {
		return 0
	}
	return now - base
}

// lostNow is Lost with beat.clock held.
func lostNow() time.Duration {
	if beat.last == 0 {
		return time.Duration(beat.lost)
	}
	return time.Duration(beat.lost + late(time.Now().UnixNano()))
}

// late returns how late a beat at now is, in ns, if it is more than a
// period late (time lost), else 0. beat.clock is held.
func late(now int64) int64 {
	if d := now - beat.last - int64(Period); d > int64(Period) {
		return d
	}
	return 0
}
