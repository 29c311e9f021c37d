package hybrid

// The live Limiters of this process, by Redis server and prefix: two whose
// limits differ would share buckets (their keys are the same), each
// rewriting the other's state under its own limit.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
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
	return nil
}

// unregister forgets l (Close).
func unregister(l *limiter) {
	at := place{serverOf(l.rdb), l.cfg.prefix}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	delete(registry.live[at], l)
	if len(registry.live[at]) == 0 {
		delete(registry.live, at)
	}
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
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return fmt.Sprintf("%s db %d", o.Addr, o.DB)
	case *redis.ClusterClient:
		addrs := slices.Clone(c.Options().Addrs)
		slices.Sort(addrs)
		return strings.Join(addrs, ",")
	case *redis.Ring:
		return strings.Join(slices.Sorted(maps.Keys(c.Options().Addrs)), ",")
	}
	return fmt.Sprintf("client %p", rdb)
}
