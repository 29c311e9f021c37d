package hybrid

// What the limiters of this process share: the live ones by Redis server
// and prefix (two whose limits differ would share buckets, their keys
// being the same, each rewriting the other's state under its own limit),
// and when each server last answered any of them.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/pulse"
)

// registry holds the limits of the live limiters of each server and
// prefix. It is safe for concurrent use.
var registry = struct {
	mu   sync.Mutex
	live map[place]map[*limiter]string // each limiter's limits, as limitsOf says
}{live: map[place]map[*limiter]string{}}

// place is where a limiter keeps its state: a Redis server (or cluster)
// and a prefix.
type place struct{ server, prefix string }

// register records l at its place, or returns an error wrapping
// tierlimit.ErrMisconfigured if a live limiter of this process keeps
// other limits there: the two would share buckets. Limiters of the same
// limits on one prefix share buckets on purpose (docs/operations.md).
func register(l *limiter) error {
	at := place{serverOf(l.rdb), l.cfg.prefix}
	mine := limitsOf(l)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, theirs := range registry.live[at] {
		if theirs != mine {
			return fmt.Errorf("hybrid: %w: another limiter of this process keeps %s under prefix %q on %s, this one %s: "+
				"their keys would share buckets; give each its own WithPrefix", tierlimit.ErrMisconfigured, theirs, at.prefix, at.server, mine)
		}
	}
	if registry.live[at] == nil {
		registry.live[at] = map[*limiter]string{}
	}
	registry.live[at][l] = mine
	pulse.Start() // the process's own stalls, for call's silence
	return nil
}

// answers holds, per server as serverOf names it, when it last answered a
// call of any limiter of this process (ns): Redis is silent only if none
// of them heard from it. Two limiters on one server (a process with a
// request limiter and a token limiter, or a test's simulated fleet) then
// share what they know: a call that ran long while the other's calls were
// answered is slow, not an outage (see call). It keeps one clock per
// server the process used, for its life.
var answers sync.Map // string -> *atomic.Int64

// heard returns the clock of rdb's server's last answer (see answers); a
// clock of its own for a client of a kind serverOf cannot name.
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
	at := place{serverOf(l.rdb), l.cfg.prefix}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if _, ok := registry.live[at][l]; !ok {
		return
	}
	delete(registry.live[at], l)
	if len(registry.live[at]) == 0 {
		delete(registry.live, at)
	}
	pulse.Stop()
}

// limitsOf describes the limits l holds keys to: its default and the
// extras of WithLimits.
func limitsOf(l *limiter) string {
	parts := []string{l.limit.String()}
	for _, x := range l.cfg.extra {
		parts = append(parts, x.String())
	}
	return strings.Join(parts, " and ")
}

// serverOf names the Redis server behind rdb: its address and database,
// the sorted addresses of a cluster or ring, else the client itself.
func serverOf(rdb redis.UniversalClient) string {
	name, _ := serverName(rdb)
	return name
}

// serverName is serverOf, and whether it named a server rather than the
// client.
func serverName(rdb redis.UniversalClient) (string, bool) {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return fmt.Sprintf("%s db %d", o.Addr, o.DB), true
	case *redis.ClusterClient:
		addrs := slices.Clone(c.Options().Addrs)
		slices.Sort(addrs)
		return strings.Join(addrs, ","), true
	case *redis.Ring:
		return strings.Join(slices.Sorted(maps.Keys(c.Options().Addrs)), ","), true
	}
	return fmt.Sprintf("client %p", rdb), false
}
