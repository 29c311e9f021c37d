// Package clientip finds a client's address behind trusted proxies, from
// the peer's address and the X-Forwarded-For or Forwarded (RFC 7239)
// field lines the proxies wrote: the rules httplimit.Middleware documents,
// shared by httplimit (HTTP headers) and grpclimit (gRPC metadata).
package clientip

import (
	"fmt"
	"net/netip"
	"strings"
)

// The bounds of a proxy header's walk (see httplimit.Middleware), so that
// what a request costs does not grow with what its client writes. A chain
// of proxies is a few hops; an element of Forwarded with for, by, proto and
// host is under 200 bytes.
const (
	// MaxElems is the number of elements of a proxy header read at most,
	// empty ones included.
	MaxElems = 16
	// MaxHeaderBytes is the number of bytes of a proxy header, from its
	// right end, read at most.
	MaxHeaderBytes = 4096
)

// Resolver finds a client's address. It must not be changed once in use;
// then it is safe for concurrent use.
type Resolver struct {
	Trusted   []netip.Prefix // the proxies whose header is believed
	Forwarded bool           // the header is Forwarded (RFC 7239), not X-Forwarded-For
	V6Bits    int            // the prefix length IPv6 clients are keyed by, 1 to 128
}

// ClientIP returns the key of the client of a request from peer (an
// address as net/http's RemoteAddr or gRPC's peer.Addr writes it) that
// carries lines, the field lines of the proxy header. A peer that is not
// an address (a Unix socket, say) is the key as it is; an empty one gives
// "", false.
func (rs *Resolver) ClientIP(peer string, lines []string) (string, bool) {
	a, ok := ParseHost(peer)
	if !ok {
		return peer, peer != ""
	}
	return rs.ClientAddr(a, lines), true
}

// ClientAddr returns the key of the client of a request from the peer at
// a that carries lines, the field lines of the proxy header: ClientIP for
// a peer already parsed.
func (rs *Resolver) ClientAddr(a netip.Addr, lines []string) string {
	if rs.IsTrusted(a) {
		if client, ok := rs.walk(lines); ok {
			return rs.Key(client)
		}
	}
	return rs.Key(a)
}

// walk returns the client named by lines, the field lines of a proxy
// header from a trusted peer. It reads the elements right to left, the
// last line first (a proxy may add a line rather than append to one), and
// returns the first address that is not a trusted proxy, or the left-most
// element when all are. ok is false when the walk stops before either: at
// an element that is not an address, after MaxElems elements or at
// MaxHeaderBytes from the right end; or when the header has no element.
func (rs *Resolver) walk(lines []string) (client netip.Addr, ok bool) {
	var left netip.Addr // the left-most trusted proxy so far
	elems, budget := 0, MaxHeaderBytes
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
			if j < 0 && !whole || elems == MaxElems {
				return netip.Addr{}, false // the element goes on past what is read
			}
			elems++
			a, empty, ok := rs.hop(line[j+1:])
			switch {
			case empty:
			case !ok:
				return netip.Addr{}, false
			case !rs.IsTrusted(a):
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
func (rs *Resolver) hop(elem string) (a netip.Addr, empty, ok bool) {
	if rs.Forwarded {
		if strings.Trim(elem, " \t;") == "" {
			return netip.Addr{}, true, true
		}
		if elem, ok = ForwardedFor(elem); !ok {
			return netip.Addr{}, false, false
		}
	} else if elem = strings.Trim(elem, " \t"); elem == "" {
		return netip.Addr{}, true, true
	}
	a, ok = ParseHost(elem)
	return a, false, ok
}

// IsTrusted reports whether a is one of the trusted proxies.
func (rs *Resolver) IsTrusted(a netip.Addr) bool {
	a = a.Unmap().WithZone("") // a prefix holds neither mapped nor zoned addresses
	for _, p := range rs.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Key returns the key of a client at a: its text, an IPv4-mapped address
// as IPv4, an IPv6 one masked to V6Bits and without its zone.
func (rs *Resolver) Key(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(rs.V6Bits) // the owner checks the bits
		a = p.Addr()
	}
	return a.String()
}

// ParseHost parses an address as RemoteAddr and proxies write it:
// "192.0.2.1", "2001:db8::1", "[2001:db8::1]", or any of these with a
// port ("192.0.2.1:443", "[2001:db8::1]:443"). Its shape picks the parse,
// so that no well-formed address costs a failed one (whose error is
// allocated).
func ParseHost(s string) (netip.Addr, bool) {
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

// AppendTrusted appends to dst the trusted proxies cidrs names: CIDRs
// such as "10.0.0.0/8" or single addresses, IPv4-mapped prefixes and
// addresses as IPv4. The error names the first that is neither.
func AppendTrusted(dst []netip.Prefix, cidrs []string) ([]netip.Prefix, error) {
	for _, s := range cidrs {
		p, err := parsePrefix(s)
		if err != nil {
			return dst, fmt.Errorf("trusted proxy %q is not an address or CIDR", s)
		}
		dst = append(dst, p)
	}
	return dst, nil
}

// parsePrefix parses one trusted proxy (see AppendTrusted).
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}
