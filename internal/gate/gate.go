// Package gate lets a Close wait for the calls in flight and turn later ones
// away, so that what Close releases (a ristretto cache, whose Close races
// with its Get, Set and Del) is never used after it.
package gate

import (
	"sync/atomic"
	"time"
)

// stripes spreads the calls in flight over cache lines: calls on different
// keys do not write one shared word.
const stripes = 16

// Gate counts the calls in flight. The zero value is an open gate. A Gate
// is safe for concurrent use and must not be copied.
type Gate struct {
	closed atomic.Bool
	inside [stripes]struct {
		n atomic.Int64
		_ [56]byte
	}
}

// Enter reports whether a call may go in, and if so counts it: the caller
// must then call Exit with the same h (any number, e.g. a hash of the key;
// it picks the stripe). After Close has begun, Enter returns false.
func (g *Gate) Enter(h uint64) bool {
	s := &g.inside[h%stripes].n
	s.Add(1)
	// Close stores closed before it reads the counts: either it sees this
	// call, or this call sees closed.
	if g.closed.Load() {
		s.Add(-1)
		return false
	}
	return true
}

// Join counts one more call inside for a caller that Enter let in and that
// hands part of its work to another goroutine, which calls Exit with the
// same h when done. It counts the call even once the gate is shut: the
// caller is still inside, so Close has not seen the gate empty.
func (g *Gate) Join(h uint64) { g.inside[h%stripes].n.Add(1) }

// Exit ends a call that Enter let in.
func (g *Gate) Exit(h uint64) { g.inside[h%stripes].n.Add(-1) }

// Closed reports whether Close has begun.
func (g *Gate) Closed() bool { return g.closed.Load() }

// Close turns later calls away and waits until none is inside. It reports
// whether this call closed the gate (false if it was closed already).
func (g *Gate) Close() bool {
	first := g.Shut()
	g.Drain(-1)
	return first
}

// Shut turns later calls away without waiting for those inside. It reports
// whether this call closed the gate (false if it was closed already).
func (g *Gate) Shut() bool { return !g.closed.Swap(true) }

// Drain waits until no call is inside, for at most wait (a negative wait:
// as long as it takes), and reports whether none is. Calls get in until
// the gate is shut.
func (g *Gate) Drain(wait time.Duration) bool {
	var deadline time.Time
	if wait >= 0 {
		deadline = time.Now().Add(wait)
	}
	pause := time.Microsecond
	for i := range g.inside {
		for g.inside[i].n.Load() != 0 {
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				return false
			}
			time.Sleep(pause)
			pause = min(2*pause, time.Millisecond)
		}
	}
	return true
}
