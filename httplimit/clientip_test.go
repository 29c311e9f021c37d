package httplimit

import (
	"strings"
	"testing"
)

// TestClientIPAllocs checks what a key costs: nothing for an IPv4 client,
// whether the peer or named in a short proxy header, and one allocation
// (the key itself) for an IPv6 one or for an IPv4 one cut out of a long
// header.
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
		allocs float64
	}{
		{"IPv4 peer", nil, "192.0.2.1:50000", nil, "192.0.2.1", 0},
		{"IPv6 peer", nil, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::", 1},
		{"IPv4 peer, proxies trusted", []Option{trusted}, "192.0.2.1:50000", nil, "192.0.2.1", 0},
		{"IPv6 peer, proxies trusted", []Option{trusted}, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::", 1},
		{"XFF IPv4 client", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7", 0},
		{"XFF IPv4 client, long header", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", strings.Repeat("192.0.2.1, ", 10) + "198.51.100.7, 10.0.0.2"}, "198.51.100.7", 1},
		{"XFF IPv6 client", []Option{trusted}, "[2001:db8:ffff::1]:50000",
			[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, 2001:db8:ffff::2"}, "2001:db8:1:2::", 1},
		{"Forwarded IPv4 client", []Option{trusted, fwd}, "10.0.0.1:50000",
			[]string{"Forwarded", "for=198.51.100.7, for=10.0.0.2"}, "198.51.100.7", 0},
		{"Forwarded IPv6 client", []Option{trusted, fwd}, "[2001:db8:ffff::1]:50000",
			[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2::", 1},
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
		})
	}
}
