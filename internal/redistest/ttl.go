package redistest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CheckTTLs fails t if any key on rdb (every master of a Cluster) lives
// without a TTL: the limiters promise never to leave one.
func CheckTTLs(t testing.TB, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	check := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*", 1000).Iterator()
		n := 0
		for iter.Next(ctx) {
			n++
			ttl, err := c.PTTL(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			if ttl == -1*time.Nanosecond || ttl == -1*time.Millisecond {
				return fmt.Errorf("key %q has no TTL", iter.Val())
			}
		}
		t.Logf("TTL audit: %d keys on %s, all with a TTL", n, c.Options().Addr)
		return iter.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		err = errors.New("unknown client type")
	}
	if err != nil {
		t.Error(err)
	}
}
