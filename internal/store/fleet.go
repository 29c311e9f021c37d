package store

import (
	"context"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/script"
)

// A hybrid fleet is the instances of one limit (same prefix and limit):
// each records itself in a sorted set in Redis every heartbeat, and the
// number alive sets each one's share of the limit while Redis is down.

// FleetKey returns the Redis key of the fleet of limit under prefix.
func FleetKey(prefix string, limit tierlimit.Limit) string {
	h := xxhash.Sum64String(fmt.Sprintf("%d/%d/%d", limit.Rate, limit.Capacity(), limit.Period))
	return fmt.Sprintf("%sfleet:%016x", prefix, h)
}

// Heartbeat records instance id in the fleet at key for ttl (or, with
// leave, takes it out) and returns the number of instances alive, and
// whether the beat added id: its first beat, or one after it was silent
// for ttl, or after Redis lost the key (a restart from empty, a failover
// to a replica that lacked it, an eviction).
func Heartbeat(ctx context.Context, rdb redis.UniversalClient, key, id string, ttl time.Duration, leave bool) (live int64, added bool, err error) {
	flag := "0"
	if leave {
		flag = "1"
	}
	reply, err := script.Heartbeat.Run(ctx, rdb, []string{key}, 0, id, ttl.Milliseconds(), flag).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	if len(reply) != 2 {
		return 0, false, fmt.Errorf("heartbeat: reply of %d values, want 2", len(reply))
	}
	return reply[0], reply[1] == 1, nil
}
