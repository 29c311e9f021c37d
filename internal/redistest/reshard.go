package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// admin returns a plain client to one node of the cluster.
func admin(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
}

// NodeID returns the cluster node id of the node at addr.
func NodeID(ctx context.Context, addr string) (string, error) {
	c := admin(addr)
	defer c.Close()
	return c.Do(ctx, "CLUSTER", "MYID").Text()
}

// poll calls cond every 20 ms until it returns nil or ctx ends.
func poll(ctx context.Context, cond func() error) error {
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// AddReplica starts a new node, makes it a replica of master (an index in
// Nodes) and waits until its replication link is up (at most 20 s). It
// returns the replica's server, which is not added to Nodes or Addrs (the
// cluster's health checks expect masters only).
func (c *Cluster) AddReplica(t testing.TB, master int) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	r := start(t, true, nil)
	id, err := NodeID(ctx, c.Addrs[master])
	if err != nil {
		t.Fatalf("redistest: CLUSTER MYID on %s: %v", c.Addrs[master], err)
	}
	rc := admin(r.Addr)
	defer rc.Close()
	if err := rc.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(c.Nodes[master].Port)).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER MEET from %s: %v", r.Addr, err)
	}
	// REPLICATE needs the master known to the new node: retry until it is.
	err = poll(ctx, func() error { return rc.Do(ctx, "CLUSTER", "REPLICATE", id).Err() })
	if err == nil {
		err = poll(ctx, func() error {
			info, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replication link not up")
			}
			return nil
		})
	}
	if err != nil {
		t.Fatalf("redistest: making %s a replica of %s: %v", r.Addr, c.Addrs[master], err)
	}
	return r
}

// Failover runs CLUSTER FAILOVER on replica, which takes over its master's
// slots, and waits until every master sees it as a master (at most 20 s).
func (c *Cluster) Failover(t testing.TB, replica *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	rc := admin(replica.Addr)
	defer rc.Close()
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("redistest: CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	id, err := NodeID(ctx, replica.Addr)
	if err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, func() error {
		for _, a := range c.Addrs {
			cl := admin(a)
			nodes, err := cl.ClusterNodes(ctx).Result()
			cl.Close()
			if err != nil {
				return err
			}
			for _, line := range strings.Split(nodes, "\n") {
				if strings.HasPrefix(line, id+" ") && !strings.Contains(line, "master") {
					return fmt.Errorf("%s does not see %s as a master yet", a, replica.Addr)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: failover to %s: %v", replica.Addr, err)
	}
}

// MigrateSlot moves slot from the node at index from to the node at index
// to, keys included, the way redis-cli --cluster reshard does: IMPORTING and
// MIGRATING, MIGRATE of the keys in batches, then SETSLOT NODE on every
// master. Clients see ASK and then MOVED redirections meanwhile.
func (c *Cluster) MigrateSlot(t testing.TB, slot, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	src, dst := admin(c.Addrs[from]), admin(c.Addrs[to])
	defer src.Close()
	defer dst.Close()
	srcID, err1 := NodeID(ctx, c.Addrs[from])
	dstID, err2 := NodeID(ctx, c.Addrs[to])
	if err1 != nil || err2 != nil {
		t.Fatalf("redistest: node ids: %v %v", err1, err2)
	}
	fail := func(what string, err error) {
		t.Fatalf("redistest: migrating slot %d from %s to %s: %s: %v", slot, c.Addrs[from], c.Addrs[to], what, err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		fail("IMPORTING", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		fail("MIGRATING", err)
	}
	host, port, _ := strings.Cut(c.Addrs[to], ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			fail("GETKEYSINSLOT", err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			fail("MIGRATE", err)
		}
	}
	for _, a := range []*redis.Client{dst, src} {
		if err := a.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err(); err != nil {
			fail("SETSLOT NODE", err)
		}
	}
	for i, addr := range c.Addrs {
		if i == from || i == to {
			continue
		}
		o := admin(addr)
		err := o.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		o.Close()
		if err != nil {
			fail("SETSLOT NODE on "+addr, err)
		}
	}
}

// SlotOwner returns the index in Nodes of the master serving slot.
func (c *Cluster) SlotOwner(t testing.TB, slot int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	cl := admin(c.Addrs[0])
	defer cl.Close()
	slots, err := cl.ClusterSlots(ctx).Result() // CLUSTER SLOTS, not SHARDS: SHARDS needs Redis 7, and the tests run on older servers too
	if err != nil {
		t.Fatalf("redistest: CLUSTER SLOTS: %v", err)
	}
	for _, s := range slots {
		if int(s.Start) <= slot && slot <= int(s.End) && len(s.Nodes) > 0 {
			for i, a := range c.Addrs {
				if a == s.Nodes[0].Addr {
					return i
				}
			}
		}
	}
	t.Fatalf("redistest: no master serves slot %d", slot)
	return -1
}
