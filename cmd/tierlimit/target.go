package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// target is where inspect reads a key's state: a single Redis, or the
// master of a Redis Cluster that owns the key's slot. Every Redis key of a
// user key carries the same hash tag, so all of them live in one slot, on
// one master, and SCAN finds them on that master alone.
type target struct {
	all     redis.UniversalClient // every server: the eviction risk is read from each master
	node    *redis.Client         // the server holding the key's slot; owned by all
	name    string                // what to print: never the credentials
	cluster bool
}

// Timeouts of inspect's clients: an operator at a terminal can wait a
// little for an answer, but not for go-redis's retries against a dead node.
const (
	inspectDialTimeout = time.Second
	inspectReadTimeout = 5 * time.Second
)

// openTarget connects to the Redis that url names, for a key whose hash tag
// is tag. A URL with addr= parameters names a Cluster by its seed nodes;
// any other names one server, which is taken for a Cluster's node when its
// INFO says cluster_enabled:1.
func openTarget(ctx context.Context, rawURL, tag string) (*target, error) {
	quietRedis()
	seeds, err := clusterSeeds(rawURL)
	switch {
	case err != nil:
		return nil, err
	case seeds != nil:
		return openCluster(ctx, seeds, tag)
	}
	base, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	// A Cluster node refuses SELECT: learn what the server is on database 0.
	probe := *base
	probe.DB = 0
	probe.DialTimeout, probe.ReadTimeout, probe.MaxRetries = inspectDialTimeout, inspectReadTimeout, 1
	srv := &server{base: &probe, name: fmt.Sprintf("redis://%s/%d", base.Addr, base.DB)}
	if err := srv.ping(ctx); err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&probe)
	on, err := clusterEnabled(ctx, rdb)
	rdb.Close()
	switch {
	case err != nil:
		return nil, fmt.Errorf("redis INFO cluster on %s: %w", srv.name, err)
	case !on:
		o := *base
		o.DialTimeout, o.ReadTimeout, o.MaxRetries = inspectDialTimeout, inspectReadTimeout, 1
		rdb := redis.NewClient(&o)
		return &target{all: rdb, node: rdb, name: srv.name}, nil
	case base.DB != 0:
		return nil, usagef("-redis %q: %s is a Redis Cluster node, and a Cluster has database 0 only", rawURL, base.Addr)
	}
	return openCluster(ctx, &redis.ClusterOptions{
		Addrs: []string{base.Addr}, Username: base.Username, Password: base.Password,
		TLSConfig: base.TLSConfig, Protocol: base.Protocol, ClientName: base.ClientName,
	}, tag)
}

// clusterSeeds parses a -redis URL with addr= parameters as a Cluster's
// seed nodes; it returns nil options for a URL without them.
func clusterSeeds(rawURL string) (*redis.ClusterOptions, error) {
	u, err := url.Parse(rawURL)
	if err != nil || !u.Query().Has("addr") {
		return nil, nil // parseRedisURL reports a bad URL
	}
	if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
		return nil, usagef("-redis %q: a Redis Cluster has database 0 only", rawURL)
	}
	u.Path = ""
	o, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return nil, usagef("-redis %q: %v (want redis://host:port?addr=host2:port2 for a Cluster)", rawURL, err)
	}
	return o, nil
}

// clusterEnabled reports whether rdb is a Redis Cluster node. A server
// that refuses INFO, or knows no cluster section (miniredis), is taken for
// a single Redis.
func clusterEnabled(ctx context.Context, rdb *redis.Client) (bool, error) {
	info, err := rdb.Info(ctx, "cluster").Result()
	var reply redis.Error
	switch {
	case errors.As(err, &reply):
		return false, nil
	case err != nil:
		return false, err
	}
	for _, line := range strings.Split(info, "\n") {
		if strings.TrimSpace(line) == "cluster_enabled:1" {
			return true, nil
		}
	}
	return false, nil
}

// openCluster connects to the Cluster seeded by o and finds the master of
// the slot of tag.
func openCluster(ctx context.Context, o *redis.ClusterOptions, tag string) (*target, error) {
	o.DialTimeout, o.ReadTimeout, o.MaxRetries = inspectDialTimeout, inspectReadTimeout, 1
	cc := redis.NewClusterClient(o)
	seeds := strings.Join(o.Addrs, ",")
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	hashKey := "{" + tag + "}" // the slot of every key of ours for the user key
	node, err := cc.MasterForKey(pctx, hashKey)
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("cannot reach the Redis Cluster at %s: %w", seeds, err)
	}
	slot, err := node.ClusterKeySlot(pctx, hashKey).Result()
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("redis CLUSTER KEYSLOT on %s: %w", node.Options().Addr, err)
	}
	name := fmt.Sprintf("%s, the Redis Cluster master of slot %d", node.Options().Addr, slot)
	return &target{all: cc, node: node, name: name, cluster: true}, nil
}

// servers names what the eviction risk was read from.
func (t *target) servers() string {
	if t.cluster {
		return "every master of the Cluster"
	}
	return "the server"
}

// close closes the clients.
func (t *target) close() { t.all.Close() }
