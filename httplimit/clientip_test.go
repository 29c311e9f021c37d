package httplimit

import "testing"

// TestClientIPAllocs checks what a key costs: one allocation, its text,
// wherever the client was found.
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
	}{
		{"IPv4 peer", nil, "192.0.2.1:50000", nil, "192.0.2.1"},
		{"IPv6 peer", nil, "[2001:db8:1:2:3:4:5:6]:50000", nil, "2001:db8:1:2::"},
		{"IPv4 peer, proxies trusted", []Option{trusted}, "192.0.2.1:50000", nil, "192.0.2.1"},
		{"XFF IPv4 client", []Option{trusted}, "10.0.0.1:50000",
			[]string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7"},
		{"XFF IPv6 client", []Option{trusted}, "[2001:db8:ffff::1]:50000",
			[]string{"X-Forwarded-For", "2001:db8:1:2:3:4:5:6, [2001:db8:ffff::2]:443"}, "2001:db8:1:2::"},
		{"Forwarded IPv4 client", []Option{trusted, fwd}, "10.0.0.1:50000",
			[]string{"Forwarded", "for=198.51.100.7;proto=https, for=10.0.0.2"}, "198.51.100.7"},
		{"Forwarded IPv6 client", []Option{trusted, fwd}, "[2001:db8:ffff::1]:50000",
			[]string{"Forwarded", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`}, "2001:db8:1:2::"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &mustNew(t, &constLimiter{}, tc.opts...).ip
			r := request(tc.remote, tc.header...)
			if key, ok := rs.clientIP(r); key != tc.key || !ok {
				t.Fatalf("clientIP = %q, %v; want %q, true", key, ok, tc.key)
			}
			if got := testing.AllocsPerRun(100, func() { rs.clientIP(r) }); got != 1 {
				t.Errorf("clientIP allocates %v times per request, want 1", got)
			}
		})
	}
}
