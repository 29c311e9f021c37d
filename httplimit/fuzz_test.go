package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// fuzzResolver trusts one IPv4 and one IPv6 range, as the seeds use.
func fuzzResolver(forwarded bool) *resolver {
	rs := &resolver{header: HeaderXForwardedFor, v6bits: DefaultIPv6Prefix, forwarded: forwarded}
	if forwarded {
		rs.header = HeaderForwarded
	}
	for _, s := range []string{"10.0.0.0/8", "2001:db8:ffff::/48"} {
		rs.trusted = append(rs.trusted, netip.MustParsePrefix(s))
	}
	rs.peers, rs.hops, rs.clients = newTrustMemo(), newTrustMemo(), newKeyMemo()
	return rs
}

// refXFF is a plain restatement of the X-Forwarded-For walk: split every
// line on commas, drop empty elements, walk right to left.
func refXFF(rs *resolver, remote string, lines []string) (string, bool) {
	peer, text, ok := parseRemote(remote)
	if !ok {
		return remote, remote != ""
	}
	if !rs.isTrusted(peer) {
		return rs.key(peer, text), true
	}
	var elems []string
	for _, l := range lines {
		for _, e := range strings.Split(l, ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				elems = append(elems, e)
			}
		}
	}
	for i := len(elems) - 1; i >= 0; i-- {
		a, t, ok := parseHost(elems[i])
		if !ok {
			return rs.key(peer, text), true
		}
		if !rs.isTrusted(a) {
			return rs.key(a, t), true
		}
	}
	if len(elems) > 0 {
		a, t, _ := parseHost(elems[0])
		return rs.key(a, t), true
	}
	return rs.key(peer, text), true
}

// refParseHost is parseHost as it was first written: try the whole string
// as an address, then strip a port, then brackets.
func refParseHost(s string) (netip.Addr, string, bool) {
	if s == "" {
		return netip.Addr{}, "", false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a, s, true
	}
	host := s
	if i := strings.LastIndexByte(s, ':'); i > 0 && (s[0] != '[' || s[i-1] == ']') {
		if !isPort(s[i+1:]) {
			return netip.Addr{}, "", false
		}
		host = s[:i]
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
		if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
			return a, host, true
		}
		return netip.Addr{}, "", false
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		return a, host, true
	}
	return netip.Addr{}, "", false
}

// FuzzClientIP checks the proxy-header walks on arbitrary input: the
// X-Forwarded-For walk against refXFF, parseHost against refParseHost, the
// Forwarded walk and parser against invariants that any correct one keeps. Lines are separated by
// '\n' in the fuzzed strings.
func FuzzClientIP(f *testing.F) {
	for _, s := range [][3]string{
		{"10.1.2.3:80", "198.51.100.1, 10.0.0.9", "for=198.51.100.1;proto=https, for=10.0.0.9"},
		{"10.1.2.3:80", "1.1.1.1, 198.51.100.1\n10.0.0.9", `for="[2001:db8:cafe::17]:4711"`},
		{"10.1.2.3:80", "198.51.100.1\n203.0.113.9, 10.0.0.9", "for=198.51.100.1\nfor=203.0.113.9"},
		{"203.0.113.7:4242", "198.51.100.1", "for=198.51.100.1"},
		{"[2001:db8:ffff::1]:443", "[2001:db8::1]:80, 2001:db8:ffff::2", `For="198.51.100.\1" ;by=x`},
		{"[::ffff:10.0.0.1]:80", " , unknown,, ", "for=unknown, for=_hidden"},
		{"10.0.0.1:1", "198.051.100.1:99999", `for="oops`},
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
	} {
		f.Add(s[0], s[1], s[2])
	}
	xff, fwd := fuzzResolver(false), fuzzResolver(true)
	direct := &resolver{v6bits: DefaultIPv6Prefix} // no trusted proxy: the IPv4 fast path
	// The same resolvers without memos: the memos, filled by every input
	// so far, must not change a key.
	unmemoXFF, unmemoFwd := *xff, *fwd
	unmemoXFF.peers, unmemoXFF.hops, unmemoXFF.clients = nil, nil, nil
	unmemoFwd.peers, unmemoFwd.hops, unmemoFwd.clients = nil, nil, nil
	f.Fuzz(func(t *testing.T, remote, xffIn, fwdIn string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		xffLines := strings.Split(xffIn, "\n")
		r.Header[HeaderXForwardedFor] = xffLines
		r.Header[HeaderForwarded] = strings.Split(fwdIn, "\n")

		if peer, text, ok := parseRemote(remote); ok {
			if got, _ := direct.clientIP(r); got != direct.key(peer, text) {
				t.Fatalf("RemoteAddr %q with no trusted proxy gave key %q, want %q", remote, got, direct.key(peer, text))
			}
		}

		for _, rs := range [][2]*resolver{{xff, &unmemoXFF}, {fwd, &unmemoFwd}} {
			for range 2 { // the second time, from the memos
				got, ok := rs[0].clientIP(r)
				want, wantOK := rs[1].clientIP(r)
				if got != want || ok != wantOK {
					t.Fatalf("with memos, request from %q with %q gave key %q, %v; without, %q, %v",
						remote, r.Header[rs[0].header], got, ok, want, wantOK)
				}
			}
		}

		got, ok := xff.clientIP(r)
		want, wantOK := refXFF(xff, remote, xffLines)
		if got != want || ok != wantOK {
			t.Fatalf("X-Forwarded-For walk of %q from %q = %q, %v; want %q, %v", xffLines, remote, got, ok, want, wantOK)
		}

		got, ok = fwd.clientIP(r)
		if ok != (remote != "") {
			t.Fatalf("Forwarded walk from %q: ok = %v", remote, ok)
		}
		peer, text, peerOK := parseRemote(remote)
		switch {
		case !peerOK:
			if got != remote {
				t.Fatalf("unparsable RemoteAddr %q gave key %q, want it as it is", remote, got)
			}
		case !fwd.isTrusted(peer):
			if want := fwd.key(peer, text); got != want {
				t.Fatalf("untrusted peer %q gave key %q, want %q", remote, got, want)
			}
		default:
			// A key is the canonical form of a client address.
			a, err := netip.ParseAddr(got)
			if err != nil || fwd.key(a, a.String()) != got {
				t.Fatalf("Forwarded %q from %q gave key %q, not a canonical client address", fwdIn, remote, got)
			}
		}

		for _, line := range r.Header[HeaderForwarded] {
			fors, ok := forwardedFors(line, nil)
			if !ok {
				continue
			}
			for _, v := range fors {
				if !strings.Contains(line, v) && !strings.Contains(line, `\`) {
					t.Fatalf("forwardedFors(%q) returned %q, not in the line", line, v)
				}
			}
		}
		refA, refText, refOK := refParseHost(xffIn)
		if a, text, ok := parseHost(xffIn); a != refA || text != refText || ok != refOK {
			t.Fatalf("parseHost(%q) = %v, %q, %v; want %v, %q, %v", xffIn, a, text, ok, refA, refText, refOK)
		}
		if a, text, ok := parseHost(xffIn); ok {
			if b, err := netip.ParseAddr(text); err != nil || a != b || !strings.Contains(xffIn, text) {
				t.Fatalf("parseHost(%q) = %v, %q: text is not the address as written", xffIn, a, text)
			}
		}
	})
}

// FuzzAppendIPv6 holds appendIPv6 to netip's text of the same address. The
// fuzzed groups are zeroed where the bits of zeros are set, so that runs of
// zero groups, which decide where "::" goes, are common.
func FuzzAppendIPv6(f *testing.F) {
	for _, s := range []string{"2001:db8::1", "::", "::1", "1::", "1:0:0:2:0:0:0:3", "1:0:0:2:0:0:3:4", "64:ff9b::192.0.2.1", "fe80::1", "2001:db8::", "0:0:0:1::", "1:0:1::", "0:0:1:2::"} {
		a16 := netip.MustParseAddr(s).As16()
		f.Add(a16[:], uint8(0))
	}
	f.Fuzz(func(t *testing.T, in []byte, zeros uint8) {
		var a16 [16]byte
		copy(a16[:], in)
		for i := range 8 {
			if zeros&(1<<i) != 0 {
				a16[2*i], a16[2*i+1] = 0, 0
			}
		}
		a := netip.AddrFrom16(a16)
		if a.Is4In6() {
			return // key unmaps these; String writes them dotted
		}
		if got, want := string(appendIPv6(nil, a)), a.String(); got != want {
			t.Fatalf("appendIPv6(%v) = %q, want %q", a16, got, want)
		}
	})
}
