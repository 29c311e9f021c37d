package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// The bounds of a proxy header's walk (see Middleware), so that what a
// request costs does not grow with what its client writes. A chain of
// proxies is a few hops; an element of Forwarded with for, by, proto and
// host is under 200 bytes.
const (
	// maxElems is the number of elements of a proxy header read at most,
	// empty ones included.
	maxElems = 16
	// maxHeaderBytes is the number of bytes of a proxy header, from its
	// right end, read at most.
	maxHeaderBytes = 4096
)

// resolver finds a request's client address. It is not changed after New.
type resolver struct {
	trusted []netip.Prefix
	header  string // canonical name of the header trusted proxies write
	v6bits  int
}

// clientIP returns the key of r's client, as Middleware describes it. A
// RemoteAddr that is not an address (a Unix socket, say) is the key as it
// is; an empty one gives "", false.
func (rs *resolver) clientIP(r *http.Request) (string, bool) {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr, r.RemoteAddr != ""
	}
	if rs.isTrusted(peer) {
		if client, ok := rs.walk(r.Header[rs.header]); ok {
			return rs.key(client), true
		}
	}
	return rs.key(peer), true
}

// walk returns the client named by lines, the field lines of a proxy
// header from a trusted peer. It reads the elements right to left, the
// last line first (a proxy may add a line rather than append to one), and
// returns the first address that is not a trusted proxy, or the left-most
// element when all are. ok is false when the walk stops before either: at
// an element that is not an address, after maxElems elements or at
// maxHeaderBytes from the right end; or when the header has no element.
func (rs *resolver) walk(lines []string) (client netip.Addr, ok bool) {
	var left netip.Addr // the left-most trusted proxy so far
	elems, budget := 0, maxHeaderBytes
	for i := len(lines) - 1; i >= 0; i-- {
		if budget <= 0 {
			return netip.Addr{}, false
		}
		line, whole := lines[i], true
		if len(line) > budget {
			line, whole = line[len(line)-budget:], false // only the right end is read
		}
		budget -= len(line) + 1
		for {
			j := strings.LastIndexByte(line, ',')
			if j < 0 && !whole || elems == maxElems {
				return netip.Addr{}, false // the element goes on past what is read
			}
			elems++
			a, empty, ok := rs.hop(line[j+1:])
			switch {
			case empty:
			case !ok:
				return netip.Addr{}, false
			case !rs.isTrusted(a):
				return a, true
			default:
				left = a
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return left, left.IsValid()
}

// hop returns the address one element of the proxy header names. empty
// is true for an element to skip: an empty list element (RFC 9110, section
// 5.6.1) or, in Forwarded, one without parameters. ok is false for one that
// names no address: malformed, "unknown", or an obfuscated identifier.
// Elements are told apart by their commas alone, which no address holds:
// a client's unterminated quote cannot swallow the elements its proxies
// append.
func (rs *resolver) hop(elem string) (a netip.Addr, empty, ok bool) {
	if rs.header == HeaderForwarded {
		if strings.Trim(elem, " \t;") == "" {
			return netip.Addr{}, true, true
		}
		if elem, ok = forwardedFor(elem); !ok {
			return netip.Addr{}, false, false
		}
	} else if elem = strings.Trim(elem, " \t"); elem == "" {
		return netip.Addr{}, true, true
	}
	a, ok = parseHost(elem)
	return a, false, ok
}

// isTrusted reports whether a is one of the trusted proxies.
func (rs *resolver) isTrusted(a netip.Addr) bool {
	a = a.Unmap().WithZone("") // a prefix holds neither mapped nor zoned addresses
	for _, p := range rs.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// key returns the key of a client at a: its text, an IPv4-mapped address
// as IPv4, an IPv6 one masked to v6bits and without its zone.
func (rs *resolver) key(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(rs.v6bits) // WithIPv6Prefix checks the bits
		a = p.Addr()
	}
	return a.String()
}

// parseHost parses an address as RemoteAddr and proxies write it:
// "192.0.2.1", "2001:db8::1", "[2001:db8::1]", or any of these with a
// port ("192.0.2.1:443", "[2001:db8::1]:443"). Its shape picks the parse,
// so that no well-formed address costs a failed one (whose error is
// allocated).
func parseHost(s string) (netip.Addr, bool) {
	if len(s) > 1 && s[0] == '[' && s[len(s)-1] == ']' {
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		return a, err == nil && a.Is6()
	}
	if colon := strings.IndexByte(s, ':'); s != "" && s[0] == '[' ||
		colon >= 0 && colon == strings.LastIndexByte(s, ':') {
		// "[IPv6]:port", or one colon: "IPv4:port".
		ap, err := netip.ParseAddrPort(s)
		return ap.Addr(), err == nil
	}
	// No colon, or two or more: an address alone.
	a, err := netip.ParseAddr(s)
	return a, err == nil
}
