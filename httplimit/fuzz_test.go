package httplimit

import (
	"github.com/tierlimit/tierlimit/internal/clientip"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// fuzzResolver trusts one IPv4 and one IPv6 range, as the seeds use.
func fuzzResolver(forwarded bool) *resolver {
	header := HeaderXForwardedFor
	if forwarded {
		header = HeaderForwarded
	}
	var trusted []netip.Prefix
	for _, s := range []string{"10.0.0.0/8", "2001:db8:ffff::/48"} {
		trusted = append(trusted, netip.MustParsePrefix(s))
	}
	rs := newResolver(trusted, header, DefaultIPv6Prefix)
	return &rs
}

// refClientIP is a plain restatement of the walk, for headers shorter than
// clientip.MaxHeaderBytes: split every line on commas, walk right to left at most
// clientip.MaxElems elements, skipping empty ones.
func refClientIP(rs *resolver, remote string, lines []string) (string, bool) {
	peer, ok := refParseHost(remote)
	if !ok {
		return remote, remote != ""
	}
	if !rs.IsTrusted(peer) {
		return rs.Key(peer), true
	}
	fwd := rs.Forwarded
	var elems []string
	for _, l := range lines {
		elems = append(elems, strings.Split(l, ",")...)
	}
	left := ""
	for i := len(elems) - 1; i >= 0; i-- {
		if len(elems)-i > clientip.MaxElems {
			return rs.Key(peer), true
		}
		e := strings.Trim(elems[i], " \t")
		if fwd && strings.Trim(e, " \t;") == "" || e == "" {
			continue
		}
		if fwd {
			if e, ok = clientip.ForwardedFor(e); !ok {
				return rs.Key(peer), true
			}
		}
		a, ok := refParseHost(e)
		switch {
		case !ok:
			return rs.Key(peer), true
		case !rs.IsTrusted(a):
			return rs.Key(a), true
		}
		left = rs.Key(a)
	}
	if left != "" {
		return left, true
	}
	return rs.Key(peer), true
}

// refParseHost is parseHost by trial: the whole string as an address,
// then in brackets, then with a port stripped.
func refParseHost(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		return a, err == nil && a.Is6()
	}
	host := s
	if i := strings.LastIndexByte(s, ':'); i > 0 && (s[0] != '[' || s[i-1] == ']') {
		if _, err := strconv.ParseUint(s[i+1:], 10, 16); err != nil {
			return netip.Addr{}, false
		}
		host = s[:i]
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		return a, err == nil && a.Is6()
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil && a.Is4()
}

// FuzzClientIP checks the walks of both proxy headers against
// refClientIP, parseHost against refParseHost, and that every key is the
// canonical text of a client address. Lines are separated by '\n' in the
// fuzzed strings.
func FuzzClientIP(f *testing.F) {
	for _, s := range [][3]string{
		{"10.1.2.3:80", "198.51.100.1, 10.0.0.9", "for=198.51.100.1;proto=https, for=10.0.0.9"},
		{"10.1.2.3:80", "1.1.1.1, 198.51.100.1\n10.0.0.9", `for="[2001:db8:cafe::17]:4711"`},
		{"10.1.2.3:80", "198.51.100.1\n203.0.113.9, 10.0.0.9", "for=198.51.100.1\nfor=203.0.113.9"},
		{"203.0.113.7:4242", "198.51.100.1", "for=198.51.100.1"},
		{"[2001:db8:ffff::1]:443", "[2001:db8::1]:80, 2001:db8:ffff::2", `For="198.51.100.\1" ;by=x`},
		{"[::ffff:10.0.0.1]:80", " , unknown,, ", "for=unknown, for=_hidden"},
		{"10.0.0.1:1", "198.051.100.1:99999", `for="oops, for=198.51.100.1`},
		{"@", "", ""},
		{"192.0.2.1:443", "", ""},
		{"999.0.2.1:443", "", ""},
		{"", "10.0.0.1", "for=10.0.0.1"},
		{"[fe80::1%eth0]:1", "10.0.0.5, 10.0.0.6", `for=1.2.3.4;for=5.6.7.8`},
		{"10.0.0.1:1", "[2001:db8::1]:443", `for="[2001:db8::1]:443"`},
		{"10.0.0.1:1", "[::]", "for=[::]"},
		{"10.0.0.1:1", "198.51.100.1:443", "for=198.51.100.1:443"},
		{"10.0.0.1:1", "::1.2.3.4", "for=[]:80"},
		{"10.0.0.1:1", "[fe80::1%a:b]:1", `for="[::ffff:1.2.3.4]"`},
		{"10.0.0.1:1", strings.Repeat("10.0.0.2, ", 20), strings.Repeat("for=10.0.0.2, ", 20)},
	} {
		f.Add(s[0], s[1], s[2])
	}
	xff, fwd := fuzzResolver(false), fuzzResolver(true)
	f.Fuzz(func(t *testing.T, remote, xffIn, fwdIn string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		r.Header[HeaderXForwardedFor] = strings.Split(xffIn, "\n")
		r.Header[HeaderForwarded] = strings.Split(fwdIn, "\n")
		for _, rs := range []*resolver{xff, fwd} {
			lines := r.Header[rs.header]
			got, ok := rs.clientIP(r)
			if len(strings.Join(lines, ",")) < clientip.MaxHeaderBytes {
				if want, wantOK := refClientIP(rs, remote, lines); got != want || ok != wantOK {
					t.Fatalf("%s %q from %q gave key %q, %v; want %q, %v", rs.header, lines, remote, got, ok, want, wantOK)
				}
			}
			if _, peerOK := clientip.ParseHost(remote); !peerOK {
				continue
			}
			if a, err := netip.ParseAddr(got); err != nil || rs.Key(a) != got {
				t.Fatalf("%s %q from %q gave key %q, not a canonical client address", rs.header, lines, remote, got)
			}
		}
		for _, s := range []string{remote, xffIn} {
			a, ok := clientip.ParseHost(s)
			if refA, refOK := refParseHost(s); ok != refOK || ok && a != refA {
				t.Fatalf("clientip.ParseHost(%q) = %v, %v; want %v, %v", s, a, ok, refA, refOK)
			}
		}
	})
}

// FuzzProxyAppends checks that nothing a client writes in its proxy header
// changes its key: behind trusted proxies that append its address, or add
// it as a line, the client is keyed by that address.
func FuzzProxyAppends(f *testing.F) {
	for _, s := range []string{`for="x`, `for="x\`, `"`, `\`, "for=10.0.0.2", `for="[::1`, "garbage;;==", "a\nb",
		strings.Repeat("10.0.0.2, ", clientip.MaxElems)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sent string) {
		for _, forwarded := range []bool{false, true} {
			rs := fuzzResolver(forwarded)
			elem := func(addr string) string {
				if forwarded {
					return `for="` + addr + `"`
				}
				return addr
			}
			for _, client := range []struct{ addr, key string }{
				{"198.51.100.7", "198.51.100.7"},
				{"[2001:db8:1:2:3:4:5:6]:4711", "2001:db8:1:2::"},
			} {
				lines := strings.Split(sent, "\n")
				for _, h := range [][]string{
					append(lines[:len(lines)-1:len(lines)-1], lines[len(lines)-1]+", "+elem(client.addr)),
					append(lines[:len(lines):len(lines)], elem(client.addr)),
					append(lines[:len(lines)-1:len(lines)-1], lines[len(lines)-1]+", "+elem(client.addr)+","+elem("10.0.0.9")),
				} {
					r := &http.Request{RemoteAddr: "10.0.0.1:443", Header: http.Header{rs.header: h}}
					if got, _ := rs.clientIP(r); got != client.key {
						t.Fatalf("%s %q from a trusted proxy gave key %q, want %q", rs.header, h, got, client.key)
					}
				}
			}
		}
	})
}
