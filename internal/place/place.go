// Package place keeps the registry of where the limiters of this process
// keep their state in Redis: a server (or cluster), a key prefix and a
// family of keys (an algorithm's, or the permits'), with the limits each
// limiter keeps there. Two live limiters whose limits differ at one place
// would share Redis keys, each rewriting the other's state under its own
// limits: every constructor of every tier takes its place here, and the
// second of two such limiters is refused.
package place

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/evict"
	"github.com/tierlimit/tierlimit/internal/logline"
)

// Spot is where a limiter keeps its state.
type Spot struct {
	Server string // as Server names it
	Prefix string
	Family string // the keys' kind: an algorithm's name in its keys, or "permits"
}

// entry is one limiter at a spot.
type entry struct {
	by     string      // the constructor that made it, for the error
	limits []string    // what it keeps there, by position, as its constructor says
	alive  func() bool // false once its owner is garbage
}

// registry holds the live limiters of each spot. It is safe for
// concurrent use.
var registry = struct {
	mu   sync.Mutex
	live map[Spot]map[uint64]entry
	next uint64
}{live: map[Spot]map[uint64]entry{}}

// Hold is a limiter's place in the registry, until Drop.
type Hold struct {
	at   Spot
	id   uint64
	once sync.Once
}

// Take records that owner, made by constructor by, keeps limits at rdb's
// server under prefix in family: one description per position of its
// keys (Limits, Permits), equal for equal limits. It returns an error
// wrapping tierlimit.ErrMisconfigured, naming both limiters, if a live
// limiter of this process keeps another limit at a position both use: the
// two would share keys. Limiters of the same limit at a position share its
// keys on purpose (docs/operations.md); a position only one of them has
// (an extra of WithLimits) is its own.
//
// The registry holds owner weakly: a limiter that is garbage (remote's
// rate limiters have no Close) gives its place up without a Drop.
func Take[T any](owner *T, by string, rdb redis.UniversalClient, prefix, family string, limits []string) (*Hold, error) {
	at := Spot{Server(rdb), prefix, family}
	registry.mu.Lock()
	theirs := clash(at, limits)
	registry.mu.Unlock()
	if theirs != nil {
		// The other limiter may be one the program dropped (a limit
		// reloaded: the old limiter replaced by a new one) that the
		// collector has not found yet.
		runtime.GC()
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if theirs := clash(at, limits); theirs != nil {
		return nil, fmt.Errorf("%w: another limiter of this process (%s) keeps %s under prefix %q on %s, this one (%s) %s: "+
			"their keys would share state; give each its own prefix", tierlimit.ErrMisconfigured,
			theirs.by, strings.Join(theirs.limits, " and "), prefix, at.Server, by, strings.Join(limits, " and "))
	}
	if registry.live[at] == nil {
		registry.live[at] = map[uint64]entry{}
	}
	registry.next++
	h := &Hold{at: at, id: registry.next}
	w := weak.Make(owner)
	registry.live[at][h.id] = entry{by: by, limits: limits, alive: func() bool { return w.Value() != nil }}
	runtime.AddCleanup(owner, func(h *Hold) { h.Drop() }, h)
	return h, nil
}

// clash returns a live limiter at at that keeps another limit than limits
// at a position both use, or nil. The caller holds registry.mu.
func clash(at Spot, limits []string) *entry {
	for _, e := range registry.live[at] {
		n := min(len(e.limits), len(limits))
		if !slices.Equal(e.limits[:n], limits[:n]) && e.alive() {
			return &e
		}
	}
	return nil
}

// Drop gives the place up (a limiter's Close). It is safe to call twice.
func (h *Hold) Drop() {
	h.once.Do(func() {
		registry.mu.Lock()
		defer registry.mu.Unlock()
		delete(registry.live[h.at], h.id)
		if len(registry.live[h.at]) == 0 {
			delete(registry.live, h.at)
		}
	})
}

// Server names the Redis server behind rdb: its address and database, the
// sorted addresses of a cluster or ring, else the client itself.
func Server(rdb redis.UniversalClient) string {
	name, _ := ServerName(rdb)
	return name
}

// ServerName is Server, and whether it named a server rather than the
// client.
func ServerName(rdb redis.UniversalClient) (string, bool) {
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

// Client checks what every constructor of a limiter in Redis checks of
// its client beyond nil (evict.NilClient): that it fits its server. It
// asks the server (evict.Read), waiting at most wait whatever the client's
// timeouts, and returns an error wrapping tierlimit.ErrMisconfigured for a
// plain client on a Cluster node or a Cluster client on a standalone
// server. A server that does not answer by then is no error: it is logged
// in logger (nil: slog.Default()), and the limiter is made anyway.
func Client(rdb redis.UniversalClient, wait time.Duration, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := evict.Read(ctx, rdb)
	switch {
	case errors.Is(err, tierlimit.ErrMisconfigured):
		return err
	case err != nil:
		what := "did not answer"
		if errors.Is(err, context.DeadlineExceeded) {
			what = fmt.Sprintf("did not answer within %v", wait)
		}
		logline.Or(logger).Warn(fmt.Sprintf("tierlimit: redis at %s %s while a limiter was made (%v): "+
			"the limiter is made anyway and asks redis again on its calls", Server(rdb), what, err))
	}
	return nil
}

// Limits describes a limiter's limits for Take: its default at position
// 0, then the extras of WithLimits.
func Limits(def tierlimit.Limit, extra []tierlimit.Limit) []string {
	out := []string{def.String()}
	for _, x := range extra {
		out = append(out, x.String())
	}
	return out
}

// Permits describes a concurrency limiter's n permits per key for Take.
func Permits(n int64) []string { return []string{fmt.Sprintf("%d permits per key", n)} }

// PermitFamily is the Family of every tier's permits.
const PermitFamily = "permits"
