package store

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/clocktest"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// backend is a Redis the tests run on, with a way to set the time the
// scripts see.
type backend struct {
	rdb redis.UniversalClient
	cfg Config          // what every limiter of the test gets
	set func(time.Time) // sets the scripts' clock
}

// t0 is a round instant the tests start at.
var t0 = time.Unix(1_700_000_000, 0)

// tagKeys are user keys that would move or split a Cluster slot if the
// library did not own the hash tag.
var tagKeys = []string{"user:42", "a{b}c", "}{", "{x}", "\xff\xfe\x00:{\x80}"}

func miniBackend(t *testing.T) backend {
	m, rdb := redistest.Mini(t)
	// The scripts read miniredis's settable server clock through TIME.
	return backend{rdb: rdb, set: m.SetTime}
}

// onEachServer runs run on miniredis, a real Redis and a 3-master Redis
// Cluster, each a subtest.
func onEachServer(t *testing.T, run func(*testing.T, redis.UniversalClient)) {
	servers := []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"miniredis", func(t *testing.T) redis.UniversalClient { return miniBackend(t).rdb }},
		{"redis", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client(t) }},
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) { run(t, s.rdb(t)) })
	}
}

// checkOn runs run on rdb, a real Redis or Cluster, with a client clock
// the run sets, then checks that every key left has a TTL.
func checkOn(t *testing.T, rdb redis.UniversalClient, run func(*testing.T, backend)) {
	c := &clocktest.Clock{}
	run(t, backend{rdb: rdb, cfg: Config{Clock: c}, set: c.Set})
	redistest.CheckTTLs(t, rdb)
}
