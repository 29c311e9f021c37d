package serve

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit"
)

// refConfig is a config in envoyproxy/ratelimit's format, with its
// documented examples' shapes: values, keys without values, nesting,
// unlimited, shadow mode, replaces and a wildcard.
const refConfig = `
domain: edge
descriptors:
  - key: generic_key
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unlimited: true
  - key: path
    value: /api/*
    rate_limit:
      unit: HOUR
      requests_per_unit: 30
  - key: database
    value: users
    descriptors:
      - key: user
        rate_limit:
          unit: day
          requests_per_unit: 40
          name: per_user
      - key: user
        value: vip
        shadow_mode: true
        detailed_metric: true
        rate_limit:
          unit: day
          requests_per_unit: 1
          replaces:
            - name: per_user
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 100
      burst: 500
      algorithm: gcra
  - key: window
    rate_limit:
      unit: minute
      requests_per_unit: 5
      algorithm: fixed_window
  - key: own
    rate_limit:
      unit: second
      requests_per_unit: 5
      tier: local
`

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := ParseConfig(File{Name: "test.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	return c
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestMatch(t *testing.T) {
	c := mustParse(t, refConfig)
	for _, tc := range []struct {
		name    string
		domain  string
		entries []Entry
		want    string // the rule's FullKey, "" for none
	}{
		{"key and value", "edge", entries("generic_key", "default"), "edge.generic_key_default"},
		{"other value, no key-only node", "edge", entries("generic_key", "other"), ""},
		{"key only matches any value", "edge", entries("remote_address", "192.0.2.7"), "edge.remote_address"},
		{"value wins over key only", "edge", entries("remote_address", "10.0.0.1"), "edge.remote_address_10.0.0.1"},
		{"wildcard value", "edge", entries("path", "/api/v1/users"), "edge.path_/api/*"},
		{"wildcard needs its prefix", "edge", entries("path", "/web/x"), ""},
		{"nested key only", "edge", entries("database", "users", "user", "alice"), "edge.database_users.user"},
		{"nested value wins", "edge", entries("database", "users", "user", "vip"), "edge.database_users.user_vip"},
		{"parent without rate_limit", "edge", entries("database", "users"), ""},
		{"longer than the config", "edge", entries("generic_key", "default", "extra", "x"), ""},
		{"unknown key", "edge", entries("nope", "x"), ""},
		{"unknown domain", "other", entries("generic_key", "default"), ""},
		{"no entries", "edge", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.Match(tc.domain, tc.entries)
			got := ""
			if r != nil {
				got = r.FullKey
			}
			if got != tc.want {
				t.Errorf("Match(%q, %v) = %q, want %q", tc.domain, tc.entries, got, tc.want)
			}
		})
	}
}

func TestRules(t *testing.T) {
	c := mustParse(t, refConfig)
	for _, tc := range []struct {
		entries []Entry
		want    Rule
	}{
		{entries("generic_key", "default"), Rule{Unit: UnitSecond, RequestsPerUnit: 10,
			Limit: tierlimit.PerSecond(10), Algorithm: AlgoTokenBucket, Tier: TierHybrid}},
		{entries("path", "/api/x"), Rule{Unit: UnitHour, RequestsPerUnit: 30,
			Limit: tierlimit.PerHour(30), Algorithm: AlgoTokenBucket, Tier: TierHybrid}},
		{entries("remote_address", "10.0.0.1"), Rule{Unlimited: true}},
		{entries("database", "users", "user", "vip"), Rule{Unit: UnitDay, RequestsPerUnit: 1, Replaces: []string{"per_user"},
			Limit: tierlimit.PerDay(1), Algorithm: AlgoTokenBucket, Tier: TierHybrid, Shadow: true, DetailedMetric: true}},
		{entries("database", "users", "user", "bob"), Rule{Name: "per_user", Unit: UnitDay, RequestsPerUnit: 40,
			Limit: tierlimit.PerDay(40), Algorithm: AlgoTokenBucket, Tier: TierHybrid}},
		{entries("blocked", "x"), Rule{Unit: UnitSecond, Limit: tierlimit.Blocked, Algorithm: AlgoTokenBucket, Tier: TierHybrid}},
		{entries("tenant", "t1"), Rule{Unit: UnitMinute, RequestsPerUnit: 100,
			Limit: tierlimit.PerMinute(100).WithBurst(500), Algorithm: AlgoGCRA, Tier: TierRemote}},
		{entries("window", "w"), Rule{Unit: UnitMinute, RequestsPerUnit: 5,
			Limit: tierlimit.PerMinute(5), Algorithm: AlgoFixedWindow, Tier: TierRemote}},
		{entries("own", "o"), Rule{Unit: UnitSecond, RequestsPerUnit: 5,
			Limit: tierlimit.PerSecond(5), Algorithm: AlgoTokenBucket, Tier: TierLocal}},
	} {
		r := c.Match("edge", tc.entries)
		if r == nil {
			t.Errorf("Match(%v) = nil, want a rule", tc.entries)
			continue
		}
		got := *r
		got.FullKey = ""
		if got.Name != tc.want.Name || got.Unit != tc.want.Unit || got.RequestsPerUnit != tc.want.RequestsPerUnit ||
			got.Limit != tc.want.Limit || got.Algorithm != tc.want.Algorithm || got.Tier != tc.want.Tier ||
			got.Unlimited != tc.want.Unlimited || got.Shadow != tc.want.Shadow || got.DetailedMetric != tc.want.DetailedMetric ||
			strings.Join(got.Replaces, ",") != strings.Join(tc.want.Replaces, ",") {
			t.Errorf("Match(%v) = %+v, want %+v", tc.entries, got, tc.want)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"empty domain", "descriptors: []", "empty domain"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}", "rate_limt"},
		{"quota mode", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true", "quota_mode"},
		{"empty key", "domain: d\ndescriptors:\n  - value: a", "empty key"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "invalid unit"},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}", "requests_per_unit"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}", "unlimited"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n  - key: a", "duplicate descriptor"},
		{"duplicate value", "domain: d\ndescriptors:\n  - key: a\n    value: v\n  - key: a\n    value: v", "duplicate descriptor"},
		{"duplicate domain", "domain: d\n---\ndomain: d", "duplicate domain"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}", "own"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}", "empty replaces"},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}", "unknown algorithm"},
		{"unknown tier", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, tier: edge}", "unknown tier"},
		{"window on hybrid", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window, tier: hybrid}", "remote tier only"},
		{"burst on a window", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_window, burst: 5}", "burst on"},
		{"negative burst", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: -1}", "negative burst"},
		{"not yaml", "domain: [", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(File{Name: "bad.yaml", Data: []byte(tc.yaml)})
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.yaml") {
				t.Errorf("ParseConfig = %v, want an ErrConfig naming bad.yaml and %q", err, tc.want)
			}
		})
	}
}

func TestUnits(t *testing.T) {
	for unit, want := range map[string]time.Duration{
		"second": time.Second, "MINUTE": time.Minute, "Hour": time.Hour, "day": 24 * time.Hour,
		"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
	} {
		c := mustParse(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: "+unit+", requests_per_unit: 3}")
		if r := c.Match("d", entries("a", "x")); r == nil || r.Limit.Period != want || r.Limit.Rate != 3 {
			t.Errorf("unit %s: rule %+v, want 3 per %v", unit, r, want)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		domain  string
		entries []Entry
		o       *override
	}{
		{"d", entries("a", "b"), nil},
		{"d|x", entries("a=b", "c|d", "!e", "\\", "", ""), nil},
		{"d", entries("k", "v1", "k2", "v2"), &override{RequestsPerUnit: 7, Unit: UnitMinute}},
		{"d", entries("!", "!"), &override{RequestsPerUnit: 0, Unit: UnitYear}},
	} {
		key := string(appendKey(nil, tc.domain, tc.entries, tc.o))
		d, es, o, ok := parseKey(key)
		if !ok || d != tc.domain || len(es) != len(tc.entries) || (o == nil) != (tc.o == nil) || (o != nil && *o != *tc.o) {
			t.Errorf("parseKey(%q) = %q, %v, %v, %v; want %q, %v, %v", key, d, es, o, ok, tc.domain, tc.entries, tc.o)
			continue
		}
		for i := range es {
			if es[i] != tc.entries[i] {
				t.Errorf("parseKey(%q) entry %d = %v, want %v", key, i, es[i], tc.entries[i])
			}
		}
	}
	// Distinct descriptors never share a key.
	a := string(appendKey(nil, "d", entries("a", "b|c=d"), nil))
	b := string(appendKey(nil, "d", entries("a", "b", "c", "d"), nil))
	if a == b {
		t.Errorf("two descriptors share the key %q", a)
	}
	// The long form: a digest and the rule's id, or the override.
	r := &Rule{id: "d|k="}
	id, o, ok := parseLongKey(longKey([]byte("d|k=v"), r, nil))
	if !ok || id != r.id || o != nil {
		t.Errorf("parseLongKey(longKey(rule)) = %q, %v, %v; want %q", id, o, ok, r.id)
	}
	ov := &override{RequestsPerUnit: 9, Unit: UnitHour}
	if id, o, ok := parseLongKey(longKey([]byte("d|k=v"), r, ov)); !ok || id != "" || o == nil || *o != *ov {
		t.Errorf("parseLongKey(longKey(override)) = %q, %v, %v; want %v", id, o, ok, ov)
	}
	if longKey([]byte("d|k=v"), r, nil) == longKey([]byte("d|k=w"), r, nil) {
		t.Error("two long descriptors share a key")
	}
	for _, k := range []string{"d|k=v", "\\#abc|x", string(appendKey(nil, "\\#", entries("a", "b"), nil))} {
		if _, _, ok := parseLongKey(k); ok {
			t.Errorf("parseLongKey(%q) ok, want not", k)
		}
	}
	for _, bad := range []string{"", "d|a", "d|a=b\\", "d|!x", "d|!1/fortnight", "d|!1/second|a=b", "d|a=b=c"} {
		if _, _, _, ok := parseKey(bad); ok {
			t.Errorf("parseKey(%q) ok, want not", bad)
		}
	}
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"a*", "abc", true},
		{"a*", "a", true},
		{"a*", "ba", false},
		{"*c", "abc", true},
		{"a*c", "ac", true},
		{"a*c", "abbc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXc", false},
		{"ab*ba", "aba", false},
		{"*", "", true},
	} {
		if got := globMatch(strings.Split(tc.pattern, "*"), tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}
