// Package perlimit caches what a limiter derives from each limit a
// LimitFunc answers (store's plans, hybrid's policies), so that a key's
// calls find theirs without validating or allocating.
package perlimit

import (
	"sync"

	"github.com/tierlimit/tierlimit"
)

// Max bounds a Cache: the limits a LimitFunc answers are a few plans, not
// one per key. Past it, a limit's value is made at each call and not kept,
// so that what was kept (and counted under it) stays.
const Max = 1024

// Cache holds a V per limit, made once, at most Max of them. The zero
// value is empty and ready. It is safe for concurrent use.
type Cache[V any] struct {
	mu sync.RWMutex
	m  map[tierlimit.Limit]V
}

// Get returns lim's value, made by build (which validates lim) if the
// cache has none, and kept unless the cache holds Max already; build's
// error is returned as it is.
func (c *Cache[V]) Get(lim tierlimit.Limit, build func() (V, error)) (V, error) {
	c.mu.RLock()
	v, ok := c.m[lim]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w, ok := c.m[lim]; ok {
		return w, nil
	}
	if len(c.m) < Max {
		if c.m == nil {
			c.m = map[tierlimit.Limit]V{}
		}
		c.m[lim] = v
	}
	return v, nil
}

// Each calls f for every value kept.
func (c *Cache[V]) Each(f func(tierlimit.Limit, V)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for lim, v := range c.m {
		f(lim, v)
	}
}
