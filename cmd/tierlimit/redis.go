package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// Timeouts of the demo's and bench's Redis clients: small, so that a dead
// Redis fails a call at once instead of holding it for go-redis's default
// seconds. Loopback answers in microseconds, but an embedded Redis shares
// the Go scheduler with the load: while every processor is busy, its
// goroutines and the clients' wait for the runtime's network poller, which
// then runs about every 10 ms, so one round trip may take tens of ms.
const (
	dialTimeout = 100 * time.Millisecond
	ioTimeout   = 100 * time.Millisecond
	pingTimeout = 2 * time.Second
)

// server is the Redis every strategy shares: an embedded miniredis, which
// the demo may kill and restart on the same port, or a real one.
// It is safe for concurrent use.
type server struct {
	base *redis.Options // address, database and credentials
	name string         // what to print: never the credentials

	mu   sync.Mutex
	mini *miniredis.Miniredis // nil for a real Redis, or while killed
	addr string               // the embedded Redis's loopback address
}

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// quietRedis keeps go-redis from logging dial failures to stderr: the
// commands report errors themselves, and log lines would tear the
// progress bar.
var quietRedis = sync.OnceFunc(logging.Disable)

// openServer starts an embedded Redis on a loopback port when url is empty,
// or checks that the Redis at url answers.
func openServer(ctx context.Context, url string) (*server, error) {
	quietRedis()
	if url == "" {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded Redis: %w", err)
		}
		return &server{base: &redis.Options{Addr: m.Addr()}, name: "embedded (miniredis on " + m.Addr() + ")",
			mini: m, addr: m.Addr()}, nil
	}
	base, err := parseRedisURL(url)
	if err != nil {
		return nil, err
	}
	s := &server{base: base, name: fmt.Sprintf("redis://%s/%d", base.Addr, base.DB)}
	if err := s.ping(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// parseRedisURL parses a -redis flag: redis://[user:password@]host:port/db.
func parseRedisURL(url string) (*redis.Options, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, usagef("-redis %q: %v (want redis://host:port/db)", url, err)
	}
	return o, nil
}

// ping checks that Redis answers, with one short dial.
func (s *server) ping(ctx context.Context) error {
	o := *s.base
	o.DialTimeout, o.MaxRetries, o.DialerRetries, o.DialerRetryTimeout = time.Second, -1, 1, time.Microsecond
	rdb := redis.NewClient(&o)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", s.name, err)
	}
	return nil
}

// embedded reports whether the Redis runs in this process.
func (s *server) embedded() bool { return s.addr != "" }

// client returns a new client of its own, failing fast when Redis is down,
// with up to pool connections; hooks are added to it.
func (s *server) client(pool int, hooks ...redis.Hook) *redis.Client {
	o := *s.base
	o.ContextTimeoutEnabled = true
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
	// One dial attempt, and no pause after it: go-redis before v9.18
	// sleeps DialerRetryTimeout after every failed attempt, the last too,
	// which holds each call against a dead Redis that long, and hybrid's
	// breakers, which count the failures as the calls return, open that
	// much later after a kill.
	o.MaxRetries, o.DialerRetries, o.DialerRetryTimeout = -1, 1, time.Microsecond
	o.PoolSize = pool
	rdb := redis.NewClient(&o)
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	return rdb
}

// kill stops the embedded Redis: its port refuses connections and its data
// is gone, as after a crash of a Redis without persistence.
func (s *server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mini != nil {
		s.mini.Close()
		s.mini = nil
	}
}

// restart starts a new, empty embedded Redis on the killed one's port.
func (s *server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mini != nil || !s.embedded() {
		return errors.New("restart: no killed embedded Redis")
	}
	m := miniredis.NewMiniRedis()
	var err error
	// The old listener is closed, but the kernel may take a moment to free
	// the port.
	for range 50 {
		if err = m.StartAddr(s.addr); err == nil {
			s.mini = m
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restart embedded Redis on %s: %w", s.addr, err)
}

// close stops the embedded Redis, if any.
func (s *server) close() { s.kill() }
