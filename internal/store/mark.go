package store

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/script"
)

// Marks: a short-lived flag per user key, in its bucket's hash slot, set and
// read through a script (so that a user allowed only the scripts can). The
// hybrid tier marks a bucket its charge-back found full after an outage.

// markKey returns the mark of a user key: '#' after the tag, where every
// state key has ':' and every refund marker '!'.
func (l *Limiter) markKey(key string) string {
	tag := keyTag(key)
	return l.bases[0] + string(tag[:]) + "}#full"
}

// Mark sets the mark of each key for ttl (at least a millisecond), in one
// pipelined round trip (one per Cluster node).
func (l *Limiter) Mark(ctx context.Context, ttl time.Duration, keys ...string) error {
	ms := max(1, ttl.Milliseconds())
	cmds := l.marks(ctx, keys, ms)
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return l.redisErr("mark", err)
		}
	}
	return nil
}

// Marked reports, for each key, whether its mark is set, in one pipelined
// round trip (one per Cluster node).
func (l *Limiter) Marked(ctx context.Context, keys ...string) ([]bool, error) {
	cmds := l.marks(ctx, keys, 0)
	out := make([]bool, len(keys))
	for i, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			return nil, l.redisErr("mark", err)
		}
		out[i] = n == 1
	}
	return out, nil
}

// marks runs mark.lua for each key with ttl_ms ms (0: read), pipelined.
func (l *Limiter) marks(ctx context.Context, keys []string, ms int64) []*redis.Cmd {
	if len(keys) == 0 {
		return nil
	}
	return l.sendAgain(ctx, script.Mark, len(keys), func(i int) ([]string, []any) {
		return []string{l.markKey(keys[i])}, []any{0, ms}
	})
}
