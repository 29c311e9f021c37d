package evict

import (
	"errors"
	"testing"

	"github.com/tierlimit/tierlimit"
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
