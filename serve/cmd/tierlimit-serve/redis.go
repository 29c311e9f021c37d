package main

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Timeouts of the Redis client. The limiters bound each of their calls by
// a context deadline (hybrid's call budget), which the client honours with
// ContextTimeoutEnabled; these bound what has no deadline, such as a dial.
const (
	dialTimeout = time.Second
	ioTimeout   = time.Second
)

// redisConn is the Redis the server uses and what to say about it.
type redisConn struct {
	rdb  redis.UniversalClient
	desc string               // never the credentials
	mini *miniredis.Miniredis // the embedded Redis, or nil
}

func (c *redisConn) close() {
	c.rdb.Close()
	if c.mini != nil {
		c.mini.Close()
	}
}

// openRedis builds the client the flags describe, or starts an embedded
// Redis when they name none.
func openRedis(f *flags) (*redisConn, error) {
	switch {
	case f.redisURL != "" && f.redisAddrs != "":
		return nil, usagef("-redis-url and -redis-addrs: give one")
	case f.redisURL != "":
		if f.redisMode != "" && f.redisMode != "single" {
			return nil, usagef("-redis-url is a standalone Redis: use -redis-addrs for -redis-mode %s", f.redisMode)
		}
		o, err := redis.ParseURL(f.redisURL)
		if err != nil {
			return nil, usagef("-redis-url: %v (want redis://host:port/db)", err)
		}
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
		return &redisConn{rdb: redis.NewClient(o), desc: fmt.Sprintf("redis://%s/%d", o.Addr, o.DB)}, nil
	case f.redisAddrs != "":
		return universal(f)
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start the embedded Redis: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout})
	return &redisConn{rdb: rdb, desc: "embedded (miniredis on " + m.Addr() + "; its state dies with this process)", mini: m}, nil
}

func universal(f *flags) (*redisConn, error) {
	addrs := strings.Split(f.redisAddrs, ",")
	for i, a := range addrs {
		addrs[i] = strings.TrimSpace(a)
		if addrs[i] == "" {
			return nil, usagef("-redis-addrs %q: an empty address", f.redisAddrs)
		}
	}
	o := &redis.UniversalOptions{
		Addrs: addrs, Username: f.redisUser, Password: f.redisPassword, DB: f.redisDB,
		ContextTimeoutEnabled: true, DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout,
	}
	if f.redisTLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	mode := f.redisMode
	if mode == "" && f.redisMaster != "" {
		mode = "sentinel"
	}
	var rdb redis.UniversalClient
	switch mode {
	case "", "single":
		if len(addrs) != 1 || f.redisMaster != "" {
			return nil, usagef("-redis-mode single takes one address and no -redis-master")
		}
		rdb = redis.NewClient(o.Simple())
	case "sentinel":
		if f.redisMaster == "" {
			return nil, usagef("-redis-mode sentinel needs -redis-master")
		}
		o.MasterName = f.redisMaster
		rdb = redis.NewFailoverClient(o.Failover())
	case "cluster":
		if f.redisMaster != "" || f.redisDB != 0 {
			return nil, usagef("-redis-mode cluster takes neither -redis-master nor -redis-db")
		}
		rdb = redis.NewClusterClient(o.Cluster())
	default:
		return nil, usagef("-redis-mode %q: want single, sentinel or cluster", mode)
	}
	desc := mode + " " + strings.Join(addrs, ",")
	if mode == "" {
		desc = "single " + addrs[0]
	}
	return &redisConn{rdb: rdb, desc: desc}, nil
}
