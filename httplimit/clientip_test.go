package httplimit

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestClientIPAllocs checks what a key costs: nothing for an IPv4 client,
// whether the peer or named in a short proxy header, and one allocation
// (the key itself) for an IPv6 one (fresh: not remembered) or for an IPv4
// one cut out of a long header. A remembered IPv6 client costs nothing.
func TestClientIPAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	trusted := WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48")
	fwd := WithProxyHeader("forwarded")
	for _, tc := range []struct {
		name   string
		opts   []Option
		remote string
		header []string
		key    string
		allocs float64 // the second time
		fresh  float64 // without the memo of clients
	}{
		{"IPv4 peer", nil, "192.0.2.1:50000", nil, "192.0.2.1", 0, 0},
		{"IPv6 peer", nil, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::", 0, 1},
		{"IPv4 peer, proxies trusted", []Option{trusted}, "192.0.2.1:50000", nil, "192.0.2.1", 0, 0},
		{"IPv6 peer, proxies trusted", []Option{trusted}, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::", 0, 1},
		{"XFF IPv4 client", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7", 0, 0},
		{"XFF IPv4 client, long header", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", strings.Repeat("192.0.2.1, ", 10) + "198.51.100.7, 10.0.0.2"}, "198.51.100.7", 1, 1},
		{"XFF IPv6 client", []Option{trusted}, "[2001:db8:ffff::1]:50000",
			[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, 2001:db8:ffff::2"}, "2001:db8:1:2::", 0, 1},
		{"Forwarded IPv4 client", []Option{trusted, fwd}, "10.0.0.1:50000",
			[]string{"Forwarded", "for=198.51.100.7, for=10.0.0.2"}, "198.51.100.7", 0, 0},
		{"Forwarded IPv6 client", []Option{trusted, fwd}, "[2001:db8:ffff::1]:50000",
			[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2::", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, tc.opts...).ip
			r := request(tc.remote, tc.header...)
			if key, ok := rs.clientIP(r); key != tc.key || !ok {
				t.Fatalf("clientIP = %q, %v; want %q, true", key, ok, tc.key)
			}
			if got := testing.AllocsPerRun(100, func() { rs.clientIP(r) }); got != tc.allocs {
				t.Errorf("clientIP allocates %v times per request, want %v", got, tc.allocs)
			}
			rs.clients = nil
			if got := testing.AllocsPerRun(100, func() { rs.clientIP(r) }); got != tc.fresh {
				t.Errorf("clientIP without the memo of clients allocates %v times per request, want %v", got, tc.fresh)
			}
		})
	}
}

// TestTrustMemo checks that remembering trusted proxies and clients
// changes no key: each request is resolved twice (the second time what it
// names comes from the memos) after the ones before it in its sequence,
// and must give the key of a resolver without memos. Only trusted proxies
// are remembered as proxies, only clients as clients, and a proxy's text
// remembered in one place (a header element) is not believed in the other
// (RemoteAddr).
func TestTrustMemo(t *testing.T) {
	type req struct {
		remote, xff, key string
	}
	const (
		peer   = "[2001:db8:ffff::1]:1"
		client = "2001:db8:1:2:3:4:5:6"
		key    = "2001:db8:1:2::"
	)
	for _, tc := range []struct {
		name       string
		reqs       []req
		remembered []string // texts the memos of proxies must hold at the end
		clients    []string // texts the memo of clients must hold
	}{
		{"proxy, then the same proxy", []req{
			{peer, client + ", 2001:db8:ffff::2", key},
			{"[2001:db8:ffff::1]:2", "2001:db8:1:3::1, 2001:db8:ffff::2", "2001:db8:1:3::"},
		}, []string{"2001:db8:ffff::1", "2001:db8:ffff::2"}, []string{client, "2001:db8:1:3::1"}},
		{"IPv4 hops behind an IPv6 proxy", []req{
			{peer, "198.51.100.7, 10.0.0.2", "198.51.100.7"},
			{peer, "198.51.100.8, 10.0.0.2", "198.51.100.8"},
		}, []string{"2001:db8:ffff::1", "10.0.0.2"}, nil},
		{"a proxy without header falls back to itself", []req{
			{peer, client, key},
			{peer, "", "2001:db8:ffff::"},
		}, []string{"2001:db8:ffff::1"}, []string{client}},
		{"all hops trusted: the left-most", []req{
			{peer, "2001:db8:ffff::3, [2001:db8:ffff::2]:443", "2001:db8:ffff::"},
			{peer, "2001:db8:ffff::3, [2001:db8:ffff::2]:443", "2001:db8:ffff::"},
		}, []string{"2001:db8:ffff::1", "2001:db8:ffff::3", "[2001:db8:ffff::2]:443"}, nil},
		{"a hop's text is not a trusted RemoteAddr", []req{
			{peer, client + ", [2001:db8:ffff::2]:443", key},
			{"[[2001:db8:ffff::2]:443]:80", "198.51.100.9", "[[2001:db8:ffff::2]:443]:80"},
		}, []string{"2001:db8:ffff::1", "[2001:db8:ffff::2]:443"}, []string{client}},
		{"a client is not remembered as a proxy", []req{
			{"[2001:db8:1::1]:1", "198.51.100.7", "2001:db8:1::"},
			{peer, "2001:db8:1::1, 2001:db8:1::2", "2001:db8:1::"},
			{"[2001:db8:1::1]:2", "198.51.100.7", "2001:db8:1::"},
		}, []string{"2001:db8:ffff::1"}, []string{"2001:db8:1::1", "2001:db8:1::2"}},
		{"behind an IPv4 proxy", []req{
			{"10.0.0.1:1", "198.51.100.7, 10.0.0.2", "198.51.100.7"},
			{"10.0.0.1:2", "[2001:db8:1::1]:443, 10.0.0.2", "2001:db8:1::"},
		}, []string{"10.0.0.1", "10.0.0.2"}, []string{"2001:db8:1::1"}},
		{"an IPv4 client is not remembered", []req{
			{"198.51.100.7:1", "", "198.51.100.7"},
			{peer, "[198.51.100.7], 2001:db8:ffff::2", "2001:db8:ffff::"},
			{peer, "198.51.100.7:443, 2001:db8:ffff::2", "198.51.100.7"},
		}, []string{"2001:db8:ffff::1", "2001:db8:ffff::2"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, WithTrustedProxies("10.0.0.0/8", "2001:db8:ffff::/48")).ip
			plain := *rs
			plain.peers, plain.hops, plain.clients = nil, nil, nil
			for i, q := range tc.reqs {
				var h []string
				if q.xff != "" {
					h = []string{"X-Forwarded-For", q.xff}
				}
				r := request(q.remote, h...)
				for pass := range 2 {
					got, _ := rs.clientIP(r)
					want, _ := plain.clientIP(r)
					if got != q.key || want != q.key {
						t.Fatalf("request %d (pass %d): key %q with memos, %q without; want %q", i, pass, got, want, q.key)
					}
				}
			}
			for _, m := range []*trustMemo{rs.peers, rs.hops} {
				for i := range m.slots {
					if p := m.slots[i].Load(); p != nil && !slices.Contains(tc.remembered, *p) {
						t.Errorf("memo holds %q", *p)
					}
				}
			}
			// Each text is held, or its slot was taken by another one.
			for _, text := range tc.remembered {
				if p, q := rs.peers.slot(text).Load(), rs.hops.slot(text).Load(); p == nil && q == nil {
					t.Errorf("%q is not remembered", text)
				}
			}
			for i := range rs.clients.slots {
				if e := rs.clients.slots[i].p.Load(); e != nil && !slices.Contains(tc.clients, e.text) {
					t.Errorf("memo of clients holds %q", e.text)
				}
			}
			for _, text := range tc.clients {
				if rs.clients.slot(text).p.Load() == nil {
					t.Errorf("client %q is not remembered", text)
				}
			}
		})
	}
}

// TestTrustMemoConcurrent resolves requests from more IPv6 proxies than
// the memos have slots, from several goroutines at once (run it with
// -race): slots are replaced under readers, and every key must still be
// the one a resolver without memos gives.
func TestTrustMemoConcurrent(t *testing.T) {
	rs := &mustNew(t, &constLimiter{}, WithTrustedProxies("2001:db8:ffff::/48")).ip
	plain := *rs
	plain.peers, plain.hops, plain.clients = nil, nil, nil
	const (
		goroutines = 8
		requests   = 2000
		proxies    = 2 * memoSlots
	)
	var wg sync.WaitGroup
	errs := make(chan string, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range requests {
				p, c := (g*requests+i)%proxies, 1+(g*7+i)%1000
				r := request(fmt.Sprintf("[2001:db8:ffff::%x]:1", p+1),
					"X-Forwarded-For", fmt.Sprintf("2001:db8:%x::1, 2001:db8:ffff:1::%x", c, p+1))
				got, _ := rs.clientIP(r)
				want, _ := plain.clientIP(r)
				if got != want || want != fmt.Sprintf("2001:db8:%x::", c) {
					errs <- fmt.Sprintf("request %d of goroutine %d: key %q with memos, %q without", i, g, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestClientIPAllocsMany resolves requests from more IPv6 proxies, or
// clients, than the memos have slots, in turn, so that nearly every lookup
// misses: the memos must not add allocations to nearly every request by
// evicting each other's entries. Behind 1,024 proxies, one client, whose
// key is remembered, costs nothing, and a replaced proxy slot two
// allocations in one try of memoReplace per memo: 0.25 in all. Among 4,096
// clients behind one proxy, each request costs its key or, when the
// client replaces another in the memo, the entry that holds its key: one.
func TestClientIPAllocsMany(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	const n = 4096
	for _, tc := range []struct {
		name    string
		request func(i int) (*http.Request, string)
		max     float64
	}{
		{"proxies", func(i int) (*http.Request, string) {
			return request(fmt.Sprintf("[2001:db8:ffff::%x]:1", i%1024+1),
				"X-Forwarded-For", fmt.Sprintf("2001:db8:1::1, 2001:db8:ffff:1::%x", i%1024+1)), "2001:db8:1::"
		}, 0.4},
		{"clients", func(i int) (*http.Request, string) {
			return request("[2001:db8:ffff::1]:1", "X-Forwarded-For", fmt.Sprintf("2001:db8:%x::1", i+1)),
				fmt.Sprintf("2001:db8:%x::", i+1)
		}, 1.01}, // a store costing two would make about 1.06
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, WithTrustedProxies("2001:db8:ffff::/48")).ip
			reqs, keys := make([]*http.Request, n), make([]string, n)
			for i := range reqs {
				reqs[i], keys[i] = tc.request(i)
			}
			// testing.AllocsPerRun truncates its average to an integer:
			// count the allocations of the whole run instead.
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			const runs = 4 * n
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := range runs {
				if key, _ := rs.clientIP(reqs[i%n]); key != keys[i%n] {
					t.Fatalf("request %d: key %q, want %q", i, key, keys[i%n])
				}
			}
			runtime.ReadMemStats(&after)
			got := float64(after.Mallocs-before.Mallocs) / runs
			t.Logf("%.3f allocations per request", got)
			if got > tc.max {
				t.Errorf("clientIP allocates %.3f times per request, want at most %v", got, tc.max)
			}
		})
	}
}

// TestTrustMemoSpread checks that a fleet of 16 proxies spreads over the
// 32 slots, also when a common port ends their texts (a hash of the last
// four bytes of the text put "[2001:db8:ffff::N]:443" in 2 slots). The
// hash is seeded: a uniform one lands 16 texts in 6 slots or more but once
// in 45 million tries.
func TestTrustMemoSpread(t *testing.T) {
	for _, format := range []string{"2001:db8:ffff::%x", "[2001:db8:ffff::%x]:443", "[2001:db8:ffff::%x]", "10.0.0.%d"} {
		m := newTrustMemo()
		slots := map[*atomic.Pointer[string]]bool{}
		for i := 1; i <= 16; i++ {
			slots[m.slot(fmt.Sprintf(format, i))] = true
		}
		if len(slots) < 6 {
			t.Errorf("16 proxies %q land in %d slots, want 6 or more", format, len(slots))
		}
	}
}
