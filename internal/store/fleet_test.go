package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestHeartbeat: a beat reports the instances alive and whether it added
// its instance to the fleet: on its first beat, and again after Redis lost
// the key (FLUSHALL here, as a restart from empty); a leave removes it.
func TestHeartbeat(t *testing.T) {
	onEachServer(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		key := "{fleet}:test"
		steps := []struct {
			name      string
			id        string
			leave     bool
			flush     bool // FLUSHALL first
			wantLive  int64
			wantAdded bool
		}{
			{"first beat", "a", false, false, 1, true},
			{"second beat", "a", false, false, 1, false},
			{"another instance", "b", false, false, 2, true},
			{"its second beat", "b", false, false, 2, false},
			{"a leaves", "a", true, false, 1, false},
			{"a again", "a", false, false, 2, true},
			{"after the key was lost", "b", false, true, 1, true},
		}
		for _, s := range steps {
			if s.flush {
				if err := flushAll(ctx, rdb); err != nil {
					t.Fatal(err)
				}
			}
			live, added, err := Heartbeat(ctx, rdb, key, s.id, time.Minute, s.leave)
			if err != nil || live != s.wantLive || added != s.wantAdded {
				t.Errorf("%s: Heartbeat = %d, %v, %v; want %d, %v, nil", s.name, live, added, err, s.wantLive, s.wantAdded)
			}
		}
	})
}

// flushAll empties every node of rdb.
func flushAll(ctx context.Context, rdb redis.UniversalClient) error {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FlushAll(ctx).Err() })
	}
	return rdb.FlushAll(ctx).Err()
}
