package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// resolver finds a request's client address. It is read-only after New
// but for its memos, which are safe for concurrent use.
type resolver struct {
	trusted   []netip.Prefix
	header    string // canonical name of the header trusted proxies write
	forwarded bool   // header is Forwarded (RFC 7239), not X-Forwarded-For
	v6bits    int

	// peers and hops remember trusted proxies: peers by the host of
	// RemoteAddr, hops by their element in the proxy header. Two memos,
	// because one text can mean different things in the two places. Nil
	// when no proxy is trusted.
	peers, hops *trustMemo
}

// newResolver returns the resolver cfg describes.
func newResolver(cfg *config) resolver {
	rs := resolver{trusted: cfg.trusted, header: cfg.header,
		forwarded: cfg.header == HeaderForwarded, v6bits: cfg.v6bits}
	if len(rs.trusted) > 0 {
		rs.peers, rs.hops = newTrustMemo(), newTrustMemo()
	}
	return rs
}

// clientIP returns the key of r's client: its address as text, an IPv6
// address masked to v6bits. It is the peer's address (RemoteAddr) unless
// the peer is a trusted proxy; then it is the right-most address of the
// proxy header that is not a trusted proxy, or the left-most one if all
// are. A malformed header, or an element that is not an address (such as
// "unknown") reached before an untrusted address, falls back to the peer:
// the header cannot be trusted. A RemoteAddr that is not an address (a Unix
// socket, say) is the key as it is; an empty one gives "", false.
func (rs *resolver) clientIP(r *http.Request) (string, bool) {
	if len(rs.trusted) == 0 {
		if host, ok := plainIPv4(r.RemoteAddr); ok {
			return host, true
		}
		return rs.peerKey(r.RemoteAddr)
	}
	// Behind an IPv6 peer ("[addr]:port"), proxies are remembered; a peer
	// found in the memo is not parsed unless the header fails.
	var (
		peer   netip.Addr
		ptext  string
		parsed bool
		memo   = rs.peers != nil && r.RemoteAddr != "" && r.RemoteAddr[0] == '['
		host   string
		client netip.Addr
		ctext  string
		found  bool
	)
	if memo {
		host = remoteHost(r.RemoteAddr)
	}
	if !memo || !rs.peers.has(host) {
		var ok bool
		peer, ptext, ok = parseRemote(r.RemoteAddr)
		if !ok {
			return r.RemoteAddr, r.RemoteAddr != ""
		}
		if !rs.isTrusted(peer) {
			return rs.key(peer, ptext), true
		}
		if memo && ptext == host {
			rs.peers.add(host)
		}
		parsed = true
	}
	if rs.forwarded {
		client, ctext, found = rs.walkForwarded(r.Header[rs.header], memo)
	} else {
		client, ctext, found = rs.walkXFF(r.Header[rs.header], memo)
	}
	if !found {
		if parsed {
			return rs.key(peer, ptext), true
		}
		return rs.peerKey(r.RemoteAddr)
	}
	if client.Is4() && !short(r.Header[rs.header]) {
		// An IPv4 key is its text in the header, and may live as long as
		// the limiter tracks it: copy it out of a header that may be large.
		// Any other key is a new string already.
		return strings.Clone(ctext), true
	}
	return rs.key(client, ctext), true
}

// peerKey returns the key of the peer whose RemoteAddr is remote.
func (rs *resolver) peerKey(remote string) (string, bool) {
	peer, text, ok := parseRemote(remote)
	if !ok {
		return remote, remote != ""
	}
	return rs.key(peer, text), true
}

// maxShortHeader is the length up to which a proxy header is short: a key
// cut out of it keeps at most that many bytes alive rather than a copy of
// 7 to 15 (a copy costs an allocation per request). Two or three hops of
// X-Forwarded-For fit.
const maxShortHeader = 64

// short reports whether the field lines of a header are short in all.
func short(lines []string) bool {
	n := 0
	for _, l := range lines {
		n += len(l)
	}
	return n <= maxShortHeader
}

func (rs *resolver) isTrusted(a netip.Addr) bool {
	a = a.Unmap().WithZone("") // a prefix contains neither mapped nor zoned addresses
	for _, p := range rs.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// key formats a client address. text is a's spelling in the request: for a
// plain IPv4 address it is already canonical (netip accepts no other
// spelling), so the common case allocates nothing. An IPv6 key is formatted
// on the stack and allocated once.
func (rs *resolver) key(a netip.Addr, text string) string {
	switch {
	case a.Is4():
		return text
	case a.Is4In6():
		return a.Unmap().String()
	}
	p, _ := a.WithZone("").Prefix(rs.v6bits) // bits are checked by WithIPv6Prefix
	var buf [maxIPv6Text]byte
	return string(appendIPv6(buf[:0], p.Addr()))
}

// step is what a walk does with one element of a proxy header.
type step uint8

const (
	stepTrusted   step = iota // a trusted proxy: keep walking left
	stepClient                // the client
	stepMalformed             // not an address: give up on the header
)

// visit classifies one element of a proxy header, with the memo of hops
// if memo is true. The address of a trusted one is not returned: it may
// not have been parsed.
func (rs *resolver) visit(elem string, memo bool) (netip.Addr, string, step) {
	if memo && rs.hops.has(elem) {
		return netip.Addr{}, "", stepTrusted
	}
	a, text, ok := parseHost(elem)
	if !ok {
		return a, text, stepMalformed
	}
	if rs.isTrusted(a) {
		if memo {
			rs.hops.add(elem)
		}
		return netip.Addr{}, "", stepTrusted
	}
	return a, text, stepClient
}

// leftmost is the client when every element of a proxy header is a
// trusted proxy: the left-most one, elem ("" if there was none).
func leftmost(elem string) (netip.Addr, string, bool) {
	if elem == "" {
		return netip.Addr{}, "", false
	}
	return parseHost(elem)
}

// walkXFF walks X-Forwarded-For right to left, over every field line (a
// proxy may add a line rather than append to one). Empty list elements are
// skipped, as RFC 9110 asks of recipients.
func (rs *resolver) walkXFF(lines []string, memo bool) (netip.Addr, string, bool) {
	var last string // the left-most trusted element so far
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			elem := line
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				elem, line = line[j+1:], line[:j]
			} else {
				line = ""
			}
			elem = trimOWS(elem)
			if elem == "" {
				continue
			}
			a, text, s := rs.visit(elem, memo)
			switch s {
			case stepClient:
				return a, text, true
			case stepMalformed:
				return netip.Addr{}, "", false
			}
			last = elem
		}
	}
	return leftmost(last)
}

// walkForwarded walks the for= parameters of Forwarded (RFC 7239) right to
// left. A field line that does not parse is malformed as a whole, since its
// elements cannot be told apart; an element without for=, or whose for= is
// "unknown" or an obfuscated identifier, is malformed when reached.
func (rs *resolver) walkForwarded(lines []string, memo bool) (netip.Addr, string, bool) {
	var (
		last string // the left-most trusted element so far
		buf  [8]string
	)
	for i := len(lines) - 1; i >= 0; i-- {
		fors, ok := forwardedFors(lines[i], buf[:0])
		if !ok {
			return netip.Addr{}, "", false
		}
		for j := len(fors) - 1; j >= 0; j-- {
			a, text, s := rs.visit(fors[j], memo)
			switch s {
			case stepClient:
				return a, text, true
			case stepMalformed:
				return netip.Addr{}, "", false
			}
			last = fors[j]
		}
	}
	return leftmost(last)
}

// plainIPv4 returns the host of a RemoteAddr "a.b.c.d:port" without
// parsing it, when that is all it can be: four groups of digits, as
// net/http writes an IPv4 peer (a RemoteAddr made by hand with, say, an
// octet above 255 is then a key as it is, as any unparsable RemoteAddr
// is). Parsing was a tenth of the middleware's time; whatever is not
// plainly IPv4 is left to parseRemote.
func plainIPv4(s string) (string, bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 7 || i > 15 || !isPort(s[i+1:]) {
		return "", false
	}
	dots := 0
	for j := 0; j < i; j++ {
		switch c := s[j]; {
		case c == '.':
			dots++
		case c < '0' || c > '9':
			return "", false
		}
	}
	return s[:i], dots == 3
}

// parseRemote parses Request.RemoteAddr: "ip:port" as net/http sets it
// from the connection (so the port is not checked), or a bare address.
func parseRemote(s string) (netip.Addr, string, bool) {
	host := remoteHost(s)
	if a, err := netip.ParseAddr(host); err == nil {
		return a, host, true
	}
	return parseHost(s)
}

// remoteHost returns RemoteAddr "host:port" without the port and the
// brackets of an IPv6 host, not checked.
func remoteHost(s string) string {
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		s = s[:i]
		if s[0] == '[' && s[len(s)-1] == ']' {
			s = s[1 : len(s)-1]
		}
	}
	return s
}

// parseHost parses one address as proxies write it: "192.0.2.1",
// "2001:db8::1", "[2001:db8::1]", or any of these with a port
// ("192.0.2.1:443", "[2001:db8::1]:443"). It returns the address (zone
// kept) and its text without brackets or port.
//
// The form is told by its syntax before anything is parsed: a failed
// netip.ParseAddr allocates its error, and trying the whole string first
// cost two allocations for every "[2001:db8::1]:443" of a Forwarded header.
func parseHost(s string) (netip.Addr, string, bool) {
	var (
		a   netip.Addr
		err error
	)
	switch i := strings.IndexByte(s, ':'); {
	case s == "":
		return netip.Addr{}, "", false
	case s[0] == '[':
		host := s
		if j := strings.LastIndexByte(s, ':'); j > 0 && s[j-1] == ']' {
			if !isPort(s[j+1:]) {
				return netip.Addr{}, "", false
			}
			host = s[:j]
		}
		if len(host) <= 2 || host[len(host)-1] != ']' {
			return netip.Addr{}, "", false
		}
		s = host[1 : len(host)-1]
		if a, err = netip.ParseAddr(s); err != nil || !a.Is6() {
			return netip.Addr{}, "", false
		}
	case i > 0 && i == strings.LastIndexByte(s, ':'):
		// One colon: an IPv4 address and a port (an IPv6 address has two
		// colons at least).
		if !isPort(s[i+1:]) {
			return netip.Addr{}, "", false
		}
		s = s[:i]
		if a, err = netip.ParseAddr(s); err != nil || !a.Is4() {
			return netip.Addr{}, "", false
		}
	default:
		if a, err = netip.ParseAddr(s); err != nil {
			return netip.Addr{}, "", false
		}
	}
	return a, s, true
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n <= 65535
}

func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
