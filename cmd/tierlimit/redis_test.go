package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxDeadCall bounds a call of the demo's clients against a Redis that is
// not there. It fails in well under a millisecond on loopback; go-redis
// before v9.18 paused DialerRetryTimeout (100 ms by default) after the
// failed dial, which held every call that long and opened hybrid's
// breakers 300 ms after the demo's kill rather than 20.
const maxDeadCall = 50 * time.Millisecond

// TestClientFailsFast calls a closed port with a new demo client and with
// the ping check, and takes the fastest of three calls each, so that a
// stall of this machine does not count. (A client's later calls fail at
// once anyway: its pool stops dialing after PoolSize failures.)
func TestClientFailsFast(t *testing.T) {
	s := &server{base: &redis.Options{Addr: closedPort(t)}}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"client", func() error {
			rdb := s.client(1)
			defer rdb.Close()
			return rdb.Ping(ctx).Err()
		}},
		{"ping", func() error { return s.ping(ctx) }},
	} {
		fastest := time.Hour
		for range 3 {
			t0 := time.Now()
			if err := c.call(); err == nil {
				t.Fatalf("%s: a call to a closed port succeeded", c.name)
			}
			fastest = min(fastest, time.Since(t0))
		}
		if fastest > maxDeadCall {
			t.Errorf("%s: a call to a closed port took %v at best, want under %v", c.name, fastest, maxDeadCall)
		}
	}
}
