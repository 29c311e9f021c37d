package tierlimit

import "time"

// Clock tells the time. The limiters that read a clock in process take
// one (local.WithClock, hybrid.WithClock, remote.WithClientClock), so that
// tests can step it. A Clock must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock of time.Now, the default of every limiter.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
