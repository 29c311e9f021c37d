package tierlimit

import "fmt"

// EvictionRisk is what a Redis server says about evicting keys: whether it
// may evict a limiter's state, which would forget what a key has spent and
// admit it afresh. Every key a limiter writes has a TTL, so every policy but
// noeviction may choose them, volatile-ttl first of all.
//
// The limiters that use Redis read it at New and about once a minute
// after, and report it through Observer.Eviction, one log line while it is
// risky or unknown, and (hybrid) Stats.
type EvictionRisk struct {
	// Policy is the server's maxmemory-policy, e.g. "allkeys-lru"; with
	// several servers (Redis Cluster), the first risky one's.
	Policy string
	// MaxMemory is the server's maxmemory in bytes; 0 means no limit.
	MaxMemory int64
	// EvictedKeys is the number of keys the servers evicted since they
	// started (evicted_keys).
	EvictedKeys int64
	// Err says why the settings could not be read (e.g. INFO refused by
	// a managed Redis); nil when they were.
	Err error
}

// Known reports whether the server's settings could be read.
func (r EvictionRisk) Known() bool { return r.Err == nil }

// Risky reports whether the server may evict a limiter's keys: it has a
// maxmemory and a policy other than noeviction. An unknown risk is not
// risky; see Known.
func (r EvictionRisk) Risky() bool {
	return r.Known() && r.MaxMemory > 0 && r.Policy != "noeviction"
}

// String describes r in one line.
func (r EvictionRisk) String() string {
	switch {
	case !r.Known():
		return fmt.Sprintf("eviction risk unknown: %v", r.Err)
	case r.Risky():
		return fmt.Sprintf("redis may evict limiter keys: maxmemory %d bytes with policy %s (%d keys evicted so far); "+
			"limits are then not enforced for the evicted keys: use a dedicated instance or noeviction",
			r.MaxMemory, r.Policy, r.EvictedKeys)
	case r.Policy == "":
		return "no eviction: the server reports no eviction policy"
	case r.MaxMemory == 0:
		return "no eviction: no maxmemory"
	}
	return fmt.Sprintf("no eviction: policy %s", r.Policy)
}
