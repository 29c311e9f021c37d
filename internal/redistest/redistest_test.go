package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServerSetGetKillRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\", nil", got, err)
	}

	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	s.Kill() // idempotent

	s.Restart(t)
	// The pool may still hold connections to the killed server; the first
	// command can fail on one of them.
	var err error
	for range 3 {
		if err = c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) && err != nil {
			continue
		}
		break
	}
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: err = %v; want redis.Nil (data gone)", err)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
}

func TestServerPauseResume(t *testing.T) {
	s := Start(t)
	// go-redis ignores context deadlines by default; bound reads instead.
	c := redis.NewClient(&redis.Options{
		Addr:            s.Addr,
		DisableIdentity: true,
		ReadTimeout:     200 * time.Millisecond,
		MaxRetries:      -1,
	})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}

	s.Pause()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded while paused")
	}

	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestServerRequirePass(t *testing.T) {
	s := Start(t, "--requirepass", "secret")
	if err := s.Client(t).Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET with password: %v", err)
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer anon.Close()
	if err := anon.Get(context.Background(), "k").Err(); err == nil {
		t.Fatal("GET without password succeeded")
	}
}

func TestServersIsolated(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("both servers on %s", a.Addr)
	}
	ctx := context.Background()
	if err := a.Client(t).Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Client(t).Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET on the other server: err = %v; want redis.Nil", err)
	}
}

func TestCleanupKillsServer(t *testing.T) {
	var s *Server
	t.Run("owner", func(t *testing.T) {
		s = Start(t)
	})
	if s == nil {
		t.Skip("redis-server unavailable")
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("directory %s still exists after cleanup (stat err %v)", s.Dir, err)
	}
	select {
	case <-s.done:
	default:
		t.Error("redis-server still running after cleanup")
	}
}

func TestCluster(t *testing.T) {
	for _, useCLI := range []bool{true, false} {
		t.Run(fmt.Sprintf("redis-cli=%v", useCLI), func(t *testing.T) {
			if useCLI && Available() {
				bin, _ := serverBinary()
				if cliBinary(bin) == "" {
					t.Skip("redis-cli not installed")
				}
			}
			c := startCluster(t, useCLI)
			if len(c.Addrs) != 3 || len(c.Nodes) != 3 {
				t.Fatalf("cluster has %d addrs and %d nodes; want 3", len(c.Addrs), len(c.Nodes))
			}
			cc := c.Client(t)
			ctx := context.Background()
			owners := map[string]bool{}
			for i := range 20 {
				key := fmt.Sprintf("key-%d", i)
				if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
					t.Fatalf("SET %s: %v", key, err)
				}
				node, err := cc.MasterForKey(ctx, key)
				if err != nil {
					t.Fatalf("MasterForKey(%s): %v", key, err)
				}
				owners[node.Options().Addr] = true
			}
			if len(owners) < 2 {
				t.Errorf("20 keys landed on %d node(s); want them spread", len(owners))
			}
			for i := range 20 {
				key := fmt.Sprintf("key-%d", i)
				if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
					t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
				}
			}
		})
	}
}

func TestClusterNodeRestart(t *testing.T) {
	c := StartCluster(t)
	cc := c.Client(t)
	ctx := context.Background()

	began := time.Now()
	c.Nodes[1].Kill()
	c.Nodes[1].Restart(t)
	c.WaitReady(t)
	t.Logf("node restart and cluster recovery took %v", time.Since(began).Round(time.Millisecond))

	deadline := time.Now().Add(5 * time.Second)
	for i := range 20 {
		key := fmt.Sprintf("key-%d", i)
		for {
			err := cc.Set(ctx, key, i, 0).Err()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("SET %s after node restart: %v", key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
