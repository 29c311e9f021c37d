package serve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "not: [yaml")
	writeFile(t, filepath.Join(dir, "notes.txt"), "ignored")
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	logger, logs := logBuffer()
	reg := prometheus.NewRegistry()
	s, err := New(cfg, mini(t), WithLogger(logger), WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := NewReloader(s, dir)
	if err := r.Reload(); !errors.Is(err, ErrUnchanged) {
		t.Fatalf("Reload of unchanged files = %v, want ErrUnchanged", err)
	}

	// A second domain, and a changed limit: both apply.
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}")
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}")
	if err := r.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if rl := s.Config().Match("a", entries("k", "v")); rl == nil || rl.RequestsPerUnit != 5 {
		t.Errorf("after reload a.k = %+v, want 5 per hour", rl)
	}
	if rl := s.Config().Match("b", entries("k", "v")); rl == nil || rl.Algorithm != AlgoFixedWindow {
		t.Errorf("after reload b.k = %+v, want a fixed window", rl)
	}
	if s.tiers.of(TierRemote, AlgoFixedWindow) == nil {
		t.Error("no fixed window limiter after a reload that needs one")
	}

	// A bad file keeps the config in effect, and says why in one log line.
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 2}")
	before := s.Config()
	err = r.Reload()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Reload of a bad file = %v, want ErrConfig", err)
	}
	if s.Config() != before {
		t.Error("a bad file replaced the config")
	}
	if n := strings.Count(logs.String(), "config reload failed"); n != 1 || !strings.Contains(logs.String(), "fortnight") ||
		!strings.Contains(logs.String(), "b.yml") {
		t.Errorf("log = %q, want one line naming the file and the reason", logs.String())
	}
	if got := testutil.ToFloat64(s.metrics.lastLoad); got != 0 {
		t.Errorf("last load success = %v after a bad file, want 0", got)
	}
	if err := r.Reload(); !errors.Is(err, ErrUnchanged) {
		t.Errorf("Reload of the same bad file = %v, want ErrUnchanged (logged once)", err)
	}

	// Fixed again.
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}")
	if err := r.Reload(); err != nil {
		t.Fatalf("Reload after the fix: %v", err)
	}
	if got := testutil.ToFloat64(s.metrics.lastLoad); got != 1 {
		t.Errorf("last load success = %v after a good file, want 1", got)
	}
	if got := testutil.ToFloat64(s.metrics.loads.WithLabelValues("error")); got != 1 {
		t.Errorf("load errors = %v, want 1", got)
	}

	// A missing path is refused too, and logged once however often it is
	// tried.
	gone := NewReloader(s, filepath.Join(dir, "gone"))
	for range 3 {
		if err := gone.Reload(); err == nil || errors.Is(err, ErrUnchanged) {
			t.Errorf("Reload of a missing path = %v, want the file system's error", err)
		}
	}
	if n := strings.Count(logs.String(), "config reload failed"); n != 2 {
		t.Errorf("%d failures logged, want 2 (the bad file, the missing path once)", n)
	}
}

// TestReloadKeepsState checks that a key keeps its bucket when its rule's
// limit changes, and that a key claimed under the previous config keeps
// that config's limit (the previous config is kept for it).
func TestReloadKeepsState(t *testing.T) {
	srv := newServer(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}", mini(t))
	runSteps(t, srv.client, []step{
		{req: request("d", desc("k", "a")), overall: ok, remaining: []int64{1}},
		{req: request("d", desc("k", "a")), overall: ok, remaining: []int64{0}},
		{req: request("d", desc("k", "a")), overall: over},
	})
	cfg := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4}")
	if err := srv.s.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if lim := srv.s.limitFunc(TierHybrid, AlgoTokenBucket)(string(appendKey(nil, "d", entries("k", "a"), nil))); lim.Rate != 4 {
		t.Errorf("limit after reload = %v, want 4/day", lim)
	}
	// A key of a rule removed from the config keeps the previous config's
	// limit (a lease claimed under it), and is blocked once that is gone
	// too.
	empty := mustParse(t, "domain: d")
	if err := srv.s.SetConfig(empty); err != nil {
		t.Fatal(err)
	}
	key := string(appendKey(nil, "d", entries("k", "a"), nil))
	if lim := srv.s.limitFunc(TierHybrid, AlgoTokenBucket)(key); lim.Rate != 4 {
		t.Errorf("limit of a removed rule = %v, want the previous config's 4/day", lim)
	}
	if err := srv.s.SetConfig(empty); err != nil {
		t.Fatal(err)
	}
	if lim := srv.s.limitFunc(TierHybrid, AlgoTokenBucket)(key); lim.Burst != -1 {
		t.Errorf("limit of a rule gone from both configs = %v, want Blocked", lim)
	}
	if lim := srv.s.limitFunc(TierRemote, AlgoFixedWindow)("not|a|key="); lim.Burst != -1 {
		t.Errorf("limit of a key no descriptor makes = %v, want Blocked", lim)
	}
	runSteps(t, srv.client, []step{{req: request("d", desc("k", "a")), overall: ok,
		codes: []rls.RateLimitResponse_Code{ok}, remaining: []int64{0}}})
}
