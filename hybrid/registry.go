package hybrid

// What the limiters of this process share: their places in the registry
// of every tier's limiters (internal/place: two whose limits differ on one
// server and prefix would share buckets, each rewriting the other's state
// under its own limit), and when each server last answered any of them.

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/place"
	"github.com/tierlimit/tierlimit/internal/pulse"
	"github.com/tierlimit/tierlimit/internal/store"
)

// register records l at its place, or returns an error wrapping
// tierlimit.ErrMisconfigured if a live limiter of this process, of any
// tier, keeps other limits there: the two would share buckets. Limiters
// of the same limits on one prefix share buckets on purpose
// (docs/operations.md).
func register(l *limiter) error {
	prefix := l.cfg.prefix
	if prefix == "" { // the bucket's keys then begin with the default
		prefix = store.DefaultPrefix
	}
	h, err := place.Take(l, "hybrid.New", l.rdb, prefix, store.TokenBucket.Name(), limitsOf(l))
	if err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	l.place.Store(h)
	pulse.Start() // the process's own stalls, for call's silence
	return nil
}

// answers holds, per server as place.Server names it, when it last answered a
// call of any limiter of this process (ns): Redis is silent only if none
// of them heard from it. Two limiters on one server (a process with a
// request limiter and a token limiter, or a test's simulated fleet) then
// share what they know: a call that ran long while the other's calls were
// answered is slow, not an outage (see call). It keeps one clock per
// server the process used, for its life.
var answers sync.Map // string -> *atomic.Int64

// heard returns the clock of rdb's server's last answer (see answers); a
// clock of its own for a client of a kind place.Server cannot name.
func heard(rdb redis.UniversalClient) *atomic.Int64 {
	server, named := serverName(rdb)
	if !named {
		return new(atomic.Int64)
	}
	c, _ := answers.LoadOrStore(server, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// unregister forgets l (Close).
func unregister(l *limiter) {
	h := l.place.Swap(nil)
	if h == nil {
		return
	}
	h.Drop()
	pulse.Stop()
}

// limitsOf describes the limits l holds keys to, by position: its default
// and the extras of WithLimits.
func limitsOf(l *limiter) []string { return place.Limits(l.limit, l.cfg.extra) }

// serverName names the Redis server behind rdb (place.ServerName), and
// reports whether it named a server rather than the client.
func serverName(rdb redis.UniversalClient) (string, bool) { return place.ServerName(rdb) }
