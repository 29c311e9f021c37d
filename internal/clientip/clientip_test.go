package clientip

import (
	"net/netip"
	"slices"
	"testing"
)

func TestAppendTrusted(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []netip.Prefix
		ok   bool
	}{
		{[]string{"10.0.0.0/8", "192.0.2.7"}, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}, true},
		{[]string{"10.1.2.3/8"}, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, true},
		{[]string{"::ffff:10.0.0.0/104", "::ffff:192.0.2.7"}, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}, true},
		{[]string{"fe80::1%eth0"}, []netip.Prefix{netip.MustParsePrefix("fe80::1/128")}, true},
		{[]string{"10.0.0.0/33"}, nil, false},
		{[]string{"proxy.example"}, nil, false},
	} {
		got, err := AppendTrusted(nil, tc.in)
		if (err == nil) != tc.ok || tc.ok && !slices.Equal(got, tc.want) {
			t.Errorf("AppendTrusted(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestClientIP(t *testing.T) {
	rs := &Resolver{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, V6Bits: 64}
	for _, tc := range []struct {
		peer  string
		lines []string
		want  string
		ok    bool
	}{
		{"192.0.2.1:443", []string{"203.0.113.5"}, "192.0.2.1", true},
		{"10.0.0.1:443", []string{"198.51.100.1, 203.0.113.5, 10.0.0.2"}, "203.0.113.5", true},
		{"[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::", true},
		{"bufconn", nil, "bufconn", true},
		{"", nil, "", false},
	} {
		if got, ok := rs.ClientIP(tc.peer, tc.lines); got != tc.want || ok != tc.ok {
			t.Errorf("ClientIP(%q, %q) = %q, %v; want %q, %v", tc.peer, tc.lines, got, ok, tc.want, tc.ok)
		}
	}
}
