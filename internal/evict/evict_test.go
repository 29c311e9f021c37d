package evict

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		info  string
		want  tierlimit.EvictionRisk
		known bool
		risky bool
	}{
		{"risky", "# Memory\r\nused_memory:100\r\nmaxmemory:1048576\r\nmaxmemory_policy:allkeys-lru\r\n# Stats\r\nevicted_keys:12\r\n",
			tierlimit.EvictionRisk{Policy: "allkeys-lru", MaxMemory: 1 << 20, EvictedKeys: 12}, true, true},
		{"volatile-ttl", "maxmemory:10\nmaxmemory_policy:volatile-ttl\nevicted_keys:0\n",
			tierlimit.EvictionRisk{Policy: "volatile-ttl", MaxMemory: 10}, true, true},
		{"noeviction", "maxmemory:10\nmaxmemory_policy:noeviction\n",
			tierlimit.EvictionRisk{Policy: "noeviction", MaxMemory: 10}, true, false},
		{"no maxmemory", "maxmemory:0\nmaxmemory_policy:allkeys-lru\n",
			tierlimit.EvictionRisk{Policy: "allkeys-lru"}, true, false},
		{"no policy (miniredis)", "# Stats\r\nevicted_keys:0\r\n", tierlimit.EvictionRisk{}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Parse(tt.info)
			if got.Known() != tt.known || got.Risky() != tt.risky {
				t.Errorf("Parse: Known %v, Risky %v; want %v, %v", got.Known(), got.Risky(), tt.known, tt.risky)
			}
			got.Err = nil
			if got != tt.want {
				t.Errorf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	safe := tierlimit.EvictionRisk{Policy: "noeviction", MaxMemory: 10, EvictedKeys: 1}
	risky := tierlimit.EvictionRisk{Policy: "allkeys-lru", MaxMemory: 10, EvictedKeys: 2}
	unknown := tierlimit.EvictionRisk{Err: errors.New("refused")}
	tests := []struct {
		name   string
		in     []tierlimit.EvictionRisk
		policy string
		known  bool
	}{
		{"one", []tierlimit.EvictionRisk{safe}, "noeviction", true},
		{"a risky node decides", []tierlimit.EvictionRisk{safe, risky, unknown}, "allkeys-lru", true},
		{"unknown over safe", []tierlimit.EvictionRisk{safe, unknown}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := merge(tt.in)
			var evicted int64
			for _, r := range tt.in {
				evicted += r.EvictedKeys
			}
			if got.Policy != tt.policy || got.Known() != tt.known || got.EvictedKeys != evicted {
				t.Errorf("merge = %+v, want policy %q, known %v, %d evicted", got, tt.policy, tt.known, evicted)
			}
		})
	}
}

// TestWatchUnreachable: a server that does not answer at the first check
// is reported once as an unknown risk, never as a safe one; its first
// answer is reported; a later silence leaves the last reading standing.
func TestWatchUnreachable(t *testing.T) {
	m, _ := redistest.Mini(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Microsecond})
	t.Cleanup(func() { rdb.Close() })
	m.Close() // down at the first check
	var reports []tierlimit.EvictionRisk
	w := NewWatch(rdb, func(r tierlimit.EvictionRisk) { reports = append(reports, r) }, nil)
	if r := w.Last(); r.Known() {
		t.Errorf("Last before any check = %v, want unknown", r)
	}
	ctx := context.Background()
	steps := []struct {
		name    string
		up      bool
		known   bool
		reports int
	}{
		{"down at the first check", false, false, 1},
		{"still down", false, false, 1},
		{"answers", true, true, 2},
		{"down again", false, true, 2},
	}
	for _, s := range steps {
		if s.up {
			if err := m.Restart(); err != nil {
				t.Fatal(err)
			}
		} else if s.name == "down again" {
			m.Close()
		}
		r, _ := w.Check(ctx)
		if r.Known() != s.known || w.Last().Known() != s.known || len(reports) != s.reports {
			t.Errorf("%s: Check = %v (known %v), %d reports; want known %v, %d reports",
				s.name, r, r.Known(), len(reports), s.known, s.reports)
		}
	}
	if len(reports) > 0 && reports[0].Known() {
		t.Errorf("first report = %v, want an unknown risk", reports[0])
	}
}

// TestNilClient: a nil client, typed or not, is refused by Read, never
// dereferenced inside go-redis.
func TestNilClient(t *testing.T) {
	for _, rdb := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		if !NilClient(rdb) {
			t.Errorf("NilClient(%T) = false, want true", rdb)
		}
		if _, err := Read(context.Background(), rdb); !errors.Is(err, errNilClient) {
			t.Errorf("Read(%T) = %v, want errNilClient", rdb, err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if NilClient(rdb) {
		t.Errorf("NilClient(a client) = true, want false")
	}
}
