package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/redistest"
	"github.com/tierlimit/tierlimit/internal/store"
	"github.com/tierlimit/tierlimit/remote"
)

// startRedis starts an embedded Redis whose clock stands still, so that
// what inspect reads is exact.
func startRedis(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	m.SetTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return m, rdb
}

func TestInspect(t *testing.T) {
	m, rdb := startRedis(t)
	ctx := context.Background()
	const key = "user:{42}:x" // braces and colons: the tag is ours, not the key's
	limit := tierlimit.PerSecond(10)
	spend := map[string]int64{"tb": 3, "gcra": 2, "fw": 4, "aw": 1, "sl": 2, "sw": 5}
	for _, a := range algorithms {
		lim, err := store.New(rdb, a.alg, limit, a.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.AllowN(ctx, key, spend[a.name]); err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
	}
	// Keys inspect must not show: another user key, another prefix.
	other, _ := remote.NewTokenBucket(rdb, limit)
	otherPrefix, _ := remote.NewTokenBucket(rdb, limit, remote.WithPrefix("elsewhere:"))
	for _, l := range []*remote.TokenBucket{other, otherPrefix} {
		k := key
		if l == other {
			k = "user:{42}:y"
		}
		if _, err := l.AllowN(ctx, k, 1); err != nil {
			t.Fatal(err)
		}
	}
	// An idempotent refund leaves a marker in the key's slot.
	ledger, _ := store.New(rdb, store.TokenBucket, limit, store.Config{Hold: time.Second})
	if _, err := ledger.Refund(ctx, store.Refund{Key: key, Spent: 1, ID: "lease-7", Holder: "inst.0", Gen: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.AllowN(ctx, key, 1); err != nil { // back to 7 tokens
		t.Fatal(err)
	}
	// A hybrid instance's lease: 2 more tokens, in the bucket's ledger.
	if _, _, err := ledger.Lease(ctx, key, store.Claim{Min: 1, Want: 2, Holder: "inst.1", Gen: 1}); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + m.Addr() + "/0"

	code, stdout, stderr := runCmd(t, "inspect", "-redis", url, "-rate", "10", key)
	if code != exitOK || stderr != "" {
		t.Fatalf("inspect = %d, stderr %q", code, stderr)
	}
	if !strings.HasPrefix(stdout, strconv.Quote(key)+": 8 key(s) under prefix \"tierlimit:\"") {
		t.Errorf("inspect: want 8 keys (sliding log has two, a refund marker):\n%s", stdout)
	}
	for _, a := range algorithms {
		names, err := keysOf(a, limit, remote.DefaultPrefix, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if !strings.Contains(stdout, strconv.Quote(n)+"\n") {
				t.Errorf("inspect lacks key %q:\n%s", n, stdout)
			}
		}
	}
	for _, want := range []string{
		`now        5\.00 of 10 tokens, refilled since`,                  // tb: the clock stands still
		`now        8 of 10 tokens`,                                      // gcra
		`now        6 of 10 left, the window ends in`,                    // fw
		`now        9 of 10 left, the window ends in 1s`,                 // aw
		`now        8 of 10 left in the last 1s`,                         // sl
		`state      window #\d+: count 5; the window before it: count 0`, // sw
		`state      log totals: cost 2, last entry #1 admitted 0s ago`,   // sl
		`oldest     entry of cost 2 admitted 0s ago`,
		`sorted set expires in 2s \(its TTL is extended once a Period\)`,
		`refund     marker of the idempotent refund "lease-7"`,
		`took       0 of its leased tokens back`,
		`algorithm  tb: token bucket`,
		// The refund of spent tokens leaves its holder's record, holding
		// nothing, so that it is not applied twice (ledger.lua's refund).
		`holder     inst\.0: 0 tokens at most, after call #1, 0 handed to it in all; spends none after in 1s`,
		`holder     inst\.1: 2 tokens at most, after call #1, 2 handed to it in all; spends none after in 1s`,
		`held       2 tokens by 2 holder`,
	} {
		if !regexp.MustCompile(want).MatchString(stdout) {
			t.Errorf("inspect output lacks %q:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stdout, "written under the limit 10/1s"); n != 7 {
		t.Errorf("%d keys written under 10/1s, want 7 (the refund marker is not):\n%s", n, stdout)
	}
	if want := "\nEviction, read from the server: no eviction: the server reports no eviction policy\n\n"; !strings.Contains(stdout, want) {
		t.Errorf("inspect output lacks %q after its first line:\n%s", want, stdout)
	}
	if strings.Contains(stdout, "user:{42}:y") || strings.Contains(stdout, "elsewhere:") || strings.Contains(stdout, "NONE") {
		t.Errorf("inspect shows another key, another prefix's, or a key without TTL:\n%s", stdout)
	}

	_, stdout, _ = runCmd(t, "inspect", key, "-rate", "20", "-redis", url) // flags after the key
	// The five string states record their limit; the sliding log's two keys
	// and the lease ledger record none (they mean the same under any).
	if n := strings.Count(stdout, "written under another limit than 20/1s"); n != 5 {
		t.Errorf("%d keys not written under 20/1s, want 5:\n%s", n, stdout)
	}
	_, stdout, _ = runCmd(t, "inspect", "-redis", url, "-prefix", "elsewhere:", key)
	if !strings.Contains(stdout, ": 1 key(s)") || !strings.Contains(stdout, "the limit's position") {
		t.Errorf("inspect -prefix elsewhere: want its one key, undecoded:\n%s", stdout)
	}
	code, stdout, _ = runCmd(t, "inspect", "-redis", url, "nobody")
	if code != exitOK || !strings.Contains(stdout, `"nobody": no keys under prefix "tierlimit:"`) {
		t.Errorf("inspect nobody = %d:\n%s", code, stdout)
	}
}

func TestParseKeyName(t *testing.T) {
	for _, tc := range []struct {
		full, key string
		ok        bool
		alg, sfx  string
	}{
		{"p:tb:abc:{0011223344556677}:k", "k", true, "tb", ""},
		{"p:sl:abc:{0011223344556677}:k:z", "k", true, "sl", ":z"},
		{"p:tb:abc:{0011223344556677}:k:held", "k", false, "", ""}, // the ledger is in the bucket's key
		{"p:gcra:abc:{0011223344556677}:k:held", "k", false, "", ""},
		{"p:sl:abc:{0011223344556677}:k:z:h", "k:z", true, "sl", ":h"},
		{"p:tb:abc:{0011223344556677}:k:z", "k", false, "", ""},
		{"p:tb:abc:{0011223344556677}:a}:b", "a}:b", true, "tb", ""},
		{"q:tb:abc:{0011223344556677}:k", "k", false, "", ""},
		{"p:tb:abc:0011223344556677:k", "k", false, "", ""},
	} {
		k, ok := parseKeyName(tc.full, "p:", tc.key)
		if ok != tc.ok || k.alg != tc.alg || k.suffix != tc.sfx {
			t.Errorf("parseKeyName(%q, %q) = %+v, %v; want alg %q suffix %q, %v", tc.full, tc.key, k, ok, tc.alg, tc.sfx, tc.ok)
		}
	}
	if got := globEscape(`a*b?[c]\`); got != `a\*b\?\[c\]\\` {
		t.Errorf("globEscape = %q", got)
	}
}

// TestInspectCluster inspects a key a remote limiter wrote on a 3-master
// Cluster, through every way of naming the Cluster: its seeds, the node
// that owns the key's slot, and a node that does not.
func TestInspectCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	cc := c.Client(t)
	ctx := context.Background()
	const key = "user:42"
	// A day's period: what is left does not refill between the calls and
	// inspect's reading.
	limit := tierlimit.Limit{Rate: 10, Period: 24 * time.Hour}
	tb, err := remote.NewTokenBucket(cc, limit)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r, err := tb.Allow(ctx, key); err != nil || !r.Allowed {
			t.Fatalf("Allow #%d = %+v, %v; want allowed", i+1, r, err)
		}
	}
	names, err := keysOf(algorithms[0], limit, remote.DefaultPrefix, key)
	if err != nil {
		t.Fatal(err)
	}
	stateKey := names[0]
	owner, err := cc.MasterForKey(ctx, stateKey)
	if err != nil {
		t.Fatal(err)
	}
	ownerAddr := owner.Options().Addr
	other := c.Addrs[0]
	if other == ownerAddr {
		other = c.Addrs[1]
	}

	for _, tc := range []struct{ name, url string }{
		{"seeds", "redis://" + c.Addrs[0] + "?addr=" + c.Addrs[1] + "&addr=" + c.Addrs[2]},
		{"owner", "redis://" + ownerAddr + "/0"},
		{"other node", "redis://" + other},
	} {
		args := []string{"inspect", "-redis", tc.url, "-rate", "10", "-period", "24h", key}
		code, stdout, stderr := runCmd(t, args...)
		if code != exitOK || stderr != "" {
			t.Fatalf("%s: run(%q) = %d, stderr %q", tc.name, args, code, stderr)
		}
		for _, want := range []string{
			strconv.Quote(key) + `: 1 key\(s\) under prefix "tierlimit:" with tag \{\w+\} on ` + regexp.QuoteMeta(ownerAddr) +
				`, the Redis Cluster master of slot \d+\n`,
			`\n` + regexp.QuoteMeta(strconv.Quote(stateKey)) + `\n`,
			`algorithm  tb: token bucket`,
			`config     \w+: written under the limit 10/24h0m0s`,
			`now        7\.00 of 10 tokens, refilled since`,
			`Eviction, read from every master of the Cluster: no eviction: no maxmemory\n`,
		} {
			if !regexp.MustCompile(want).MatchString(stdout) {
				t.Errorf("%s: inspect output lacks %q:\n%s", tc.name, want, stdout)
			}
		}
	}

	// A master that does not hold the key may still evict others' keys:
	// inspect reads every master.
	rdb := redis.NewClient(&redis.Options{Addr: other})
	defer rdb.Close()
	for _, kv := range [][2]string{{"maxmemory", "64mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, stdout, _ := runCmd(t, "inspect", "-redis", "redis://"+ownerAddr, key)
	want := "Eviction, read from every master of the Cluster: redis may evict limiter keys: maxmemory 67108864 bytes with policy allkeys-lru"
	if !strings.Contains(stdout, want) {
		t.Errorf("inspect after CONFIG SET maxmemory on %s: output lacks %q:\n%s", other, want, stdout)
	}

	// A Cluster has database 0 only.
	args := []string{"inspect", "-redis", "redis://" + other + "/3", key}
	code, _, stderr := runCmd(t, args...)
	if want := "a Cluster has database 0 only"; code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("run(%q) = %d, stderr %q; want %d and %q", args, code, stderr, exitUsage, want)
	}
}

func TestInspectBadClusterURL(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"redis://127.0.0.1:7000/2?addr=127.0.0.1:7001", "a Redis Cluster has database 0 only"},
		{"redis://127.0.0.1:7000?addr=nohost", "unable to parse addr param"},
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&db=1", "unexpected option: db"},
	} {
		args := []string{"inspect", "-redis", tc.url, "k"}
		code, stdout, stderr := runCmd(t, args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("run(%q) = %d, stdout %q; want %d and nothing", args, code, stdout, exitUsage)
		}
		oneErrorLine(t, args, stderr, "tierlimit inspect: ")
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("run(%q): stderr = %q, want it to contain %q", args, stderr, tc.want)
		}
	}
}

// TestInspectEviction checks inspect's line on eviction against real
// servers: one that may evict, one that may not, one that refuses INFO.
func TestInspectEviction(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string // redis-server's
		want string   // the line
		gone string   // why no key is found
	}{
		{"plain", nil,
			"Eviction, read from the server: no eviction: no maxmemory\n", "or its state expired ("},
		{"allkeys-lru", []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"},
			"Eviction, read from the server: redis may evict limiter keys: maxmemory 67108864 bytes with policy allkeys-lru (0 keys evicted so far)",
			"or its state expired or was evicted ("},
		{"INFO refused", []string{"--rename-command", "INFO", ""},
			"Eviction, read from the server: eviction risk unknown: INFO refused: ERR unknown command",
			"or its state expired ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, tc.args...)
			args := []string{"inspect", "-redis", "redis://" + srv.Addr + "/0", "nobody"}
			code, stdout, stderr := runCmd(t, args...)
			if code != exitOK || stderr != "" {
				t.Fatalf("run(%q) = %d, stderr %q", args, code, stderr)
			}
			if !strings.Contains(stdout, tc.want) || !strings.Contains(stdout, tc.gone) {
				t.Errorf("run(%q):\n%s\nwant %q and %q", args, stdout, tc.want, tc.gone)
			}
		})
	}
}
