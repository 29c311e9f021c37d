package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long creating a cluster, or waiting for it to be
// healthy, may take.
const clusterTimeout = 20 * time.Second

// clusterSize is the number of masters StartCluster creates.
const clusterSize = 3

// Cluster is a Redis Cluster of 3 masters, without replicas, on loopback
// ports.
type Cluster struct {
	// Addrs are the nodes' addresses, in the order of Nodes.
	Addrs []string
	// Nodes are the nodes' servers. Killing or restarting one of them
	// simulates a node failure; Restart keeps the node's cluster identity
	// and slots but not its data.
	Nodes []*Server
}

// StartCluster starts 3 redis-server nodes in cluster mode (each with its
// own cluster config file in its temporary directory and a node timeout of
// 2 s), joins them into one cluster whose masters share the 16384 slots, and
// waits until every node reports cluster_state:ok and knows every slot (at
// most 20 s). The nodes are killed and their directories removed at
// t.Cleanup.
//
// The cluster is created with CLUSTER ADDSLOTS and CLUSTER MEET, which is
// faster and steadier than redis-cli --cluster create.
// When no redis-server is found, StartCluster skips t, or fails it if Required.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, false)
}

// startCluster is StartCluster, using redis-cli only when useCLI is set.
func startCluster(t testing.TB, useCLI bool) *Cluster {
	t.Helper()
	bin := requireBinary(t)
	began := time.Now()
	c := &Cluster{}
	for range clusterSize {
		n := start(t, true, nil)
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	how := "CLUSTER MEET"
	var err error
	if cli := cliBinary(bin); useCLI && cli != "" {
		how = "redis-cli"
		err = createWithCLI(ctx, cli, c.Addrs)
	} else {
		err = createWithCommands(ctx, c.Nodes)
	}
	if err != nil {
		t.Fatalf("redistest: creating cluster on %s with %s: %v", strings.Join(c.Addrs, ", "), how, err)
	}
	if err := c.wait(ctx); err != nil {
		t.Fatalf("redistest: cluster on %s not ready within %v: %v", strings.Join(c.Addrs, ", "), clusterTimeout, err)
	}
	t.Logf("redistest: redis cluster of %d masters on %s ready in %v (created with %s)",
		clusterSize, strings.Join(c.Addrs, ", "), time.Since(began).Round(time.Millisecond), how)
	return c
}

// cliBinary returns the redis-cli next to bin, else the one on PATH, else "".
func cliBinary(bin string) string {
	sibling := filepath.Join(filepath.Dir(bin), "redis-cli")
	if fi, err := os.Stat(sibling); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return sibling
	}
	if p, err := exec.LookPath("redis-cli"); err == nil {
		return p
	}
	return ""
}

// createWithCLI creates the cluster with redis-cli --cluster create.
func createWithCLI(ctx context.Context, cli string, addrs []string) error {
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v; redis-cli output:\n%s", err, out)
	}
	return nil
}

// createWithCommands splits the slots evenly between nodes, gives each a
// distinct config epoch and introduces them to the first node.
func createWithCommands(ctx context.Context, nodes []*Server) error {
	clients := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr, DisableIdentity: true})
		defer clients[i].Close()
	}
	const slots = 16384
	for i, c := range clients {
		lo, hi := i*slots/len(nodes), (i+1)*slots/len(nodes)-1
		if err := c.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTS %d..%d on %s: %w", lo, hi, nodes[i].Addr, err)
		}
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", nodes[i].Addr, err)
		}
	}
	for _, n := range nodes[1:] {
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.Port)).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s from %s: %w", n.Addr, nodes[0].Addr, err)
		}
	}
	return nil
}

// WaitReady waits until every node of c reports cluster_state:ok, knows every
// slot and sees every other node as a connected master (at most 20 s), and
// fails t otherwise. Use it after restarting a node.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.wait(ctx); err != nil {
		t.Fatalf("redistest: cluster on %s not ready within %v: %v", strings.Join(c.Addrs, ", "), clusterTimeout, err)
	}
}

// wait polls every node until all are healthy or ctx is done.
func (c *Cluster) wait(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{
			Addr:            n.Addr,
			DisableIdentity: true,
			MaxRetries:      -1,
			DialTimeout:     250 * time.Millisecond,
			ReadTimeout:     time.Second,
		})
		defer clients[i].Close()
	}
	for {
		err := c.healthy(ctx, clients)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// healthy reports why the cluster is not yet usable from every node, or nil.
func (c *Cluster) healthy(ctx context.Context, clients []*redis.Client) error {
	want := make(map[string]bool, len(c.Addrs))
	for _, a := range c.Addrs {
		want[a] = true
	}
	for i, cl := range clients {
		addr := c.Addrs[i]
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", addr, err)
		}
		fields := map[string]string{}
		for _, line := range strings.Split(info, "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				fields[k] = v
			}
		}
		for k, v := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": "16384",
			"cluster_slots_ok":       "16384",
			"cluster_known_nodes":    strconv.Itoa(len(c.Addrs)),
		} {
			if fields[k] != v {
				return fmt.Errorf("%s reports %s:%s, want %s", addr, k, fields[k], v)
			}
		}

		nodes, err := cl.ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", addr, err)
		}
		if err := checkNodes(nodes, want); err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", addr, err)
		}
	}
	return nil
}

// checkNodes verifies a CLUSTER NODES reply: exactly the wanted addresses,
// all connected masters in no failure or handshake state, covering every
// slot.
func checkNodes(reply string, want map[string]bool) error {
	seen := map[string]bool{}
	slots := 0
	for _, line := range strings.Split(strings.TrimSpace(reply), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return fmt.Errorf("malformed line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		addr, _, _ = strings.Cut(addr, ",")
		if !want[addr] {
			return fmt.Errorf("unexpected node address %q", f[1])
		}
		seen[addr] = true
		flags := "," + f[2] + ","
		if !strings.Contains(flags, ",master,") {
			return fmt.Errorf("node %s is not a master (flags %s)", addr, f[2])
		}
		for _, bad := range []string{",fail,", ",fail?,", ",handshake,", ",noaddr,"} {
			if strings.Contains(flags, bad) {
				return fmt.Errorf("node %s has flags %s", addr, f[2])
			}
		}
		if f[7] != "connected" {
			return fmt.Errorf("node %s link is %s", addr, f[7])
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // slot being migrated or imported
			}
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("bad slot range %q: %w", r, err)
			}
			slots += b - a + 1
		}
	}
	if len(seen) != len(want) {
		return fmt.Errorf("sees %d of %d nodes", len(seen), len(want))
	}
	if slots != 16384 {
		return fmt.Errorf("slots cover %d of 16384", slots)
	}
	return nil
}

// Client returns a *redis.ClusterClient for c, closed at t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:           c.Addrs,
		DisableIdentity: true,
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
