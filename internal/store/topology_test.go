package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestRedirectionToAPlainClientIsMisconfigured: a MOVED reply (got here
// from a real Cluster node for a key it does not own) means a client for
// one server is on a Cluster node: a misconfiguration for a store on a
// plain client. A Cluster client follows redirections, so one that reaches
// a store on a Cluster client is a passing state (resharding), not one.
func TestRedirectionToAPlainClientIsMisconfigured(t *testing.T) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t)
	var moved error
	for i := 0; moved == nil && i < 100; i++ {
		node := redis.NewClient(&redis.Options{Addr: cluster.Addrs[0]})
		err := node.Get(ctx, fmt.Sprint("key", i)).Err()
		node.Close()
		if err != nil && strings.HasPrefix(err.Error(), "MOVED ") {
			moved = err
		}
	}
	if moved == nil {
		t.Fatal("no key of 100 got MOVED from one node of three")
	}
	plain, err := New(redistest.Start(t).Client(t), TokenBucket, tierlimit.PerSecond(10), Config{})
	if err != nil {
		t.Fatal(err)
	}
	clustered, err := New(cluster.Client(t), TokenBucket, tierlimit.PerSecond(10), Config{})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := fmt.Errorf("remote: lease: %w", moved)
	for _, c := range []struct {
		name string
		l    *Limiter
		want bool
	}{{"plain client", plain, true}, {"cluster client", clustered, false}} {
		if got := c.l.Misconfigured(wrapped); got != c.want {
			t.Errorf("%s: Misconfigured(%v) = %v, want %v", c.name, wrapped, got, c.want)
		}
		if got := errors.Is(c.l.redisErr("lease", moved), tierlimit.ErrMisconfigured); got != c.want {
			t.Errorf("%s: redisErr(MOVED) wraps ErrMisconfigured = %v, want %v", c.name, got, c.want)
		}
	}
}
