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
	// clients remembers the keys of IPv6 clients, wherever they were
	// found: its texts are addresses without brackets or port, which mean
	// the same in RemoteAddr and in a header.
	clients *keyMemo
}

// newResolver returns the resolver cfg describes.
func newResolver(cfg *config) resolver {
	rs := resolver{trusted: cfg.trusted, header: cfg.header,
		forwarded: cfg.header == HeaderForwarded, v6bits: cfg.v6bits, clients: newKeyMemo()}
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
	}
	// A peer remembered as a proxy is not parsed unless the header fails.
	var (
		host   = remoteHost(r.RemoteAddr)
		peer   netip.Addr
		text   string
		parsed bool
	)
	if !rs.peers.has(host) {
		key, a, t, proxy := rs.peerKey(r.RemoteAddr, host)
		if !proxy {
			return key, key != ""
		}
		if t == host {
			rs.peers.add(host)
		}
		peer, text, parsed = a, t, true
	}
	var (
		key   string
		found bool
	)
	if rs.forwarded {
		key, found = rs.walkForwarded(r.Header[rs.header])
	} else {
		key, found = rs.walkXFF(r.Header[rs.header])
	}
	if found {
		return key, true
	}
	// The peer is a trusted proxy, whose key is not remembered.
	if !parsed {
		peer, text, _ = parseRemote(r.RemoteAddr) // parsed before it was remembered
	}
	return rs.key(peer, text), true
}

// peerKey returns the key of the peer whose RemoteAddr is remote, and
// whose host (remoteHost) is host, unless the peer is a trusted proxy:
// then it returns the peer's address and its text, and proxy true. A
// RemoteAddr that is not an address is the key as it is.
func (rs *resolver) peerKey(remote, host string) (key string, peer netip.Addr, text string, proxy bool) {
	var slot *keySlot
	if isBracketed(remote) {
		s, key, ok := rs.clients.lookup(host)
		if ok {
			return key, netip.Addr{}, "", false
		}
		slot = s
	}
	peer, text, ok := parseRemote(remote)
	switch {
	case !ok:
		return remote, netip.Addr{}, "", false
	case rs.isTrusted(peer):
		return "", peer, text, true
	case text != host:
		slot = nil // not the text looked up: not remembered
	}
	return rs.clientKey(peer, text, nil, slot), netip.Addr{}, "", false
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
	var buf [maxIPv6Text]byte
	return string(rs.appendKey6(buf[:0], a))
}

// clientKey is key for the address a of a client, text as written in
// RemoteAddr (lines nil) or in the field lines of a proxy header. An IPv4
// key cut out of a header that is not short is copied: the limiter may
// keep it as long as it tracks the client. An IPv6 key is remembered in
// slot, text's slot in the memo of clients (nil for none), if it claims it.
func (rs *resolver) clientKey(a netip.Addr, text string, lines []string, slot *keySlot) string {
	switch {
	case a.Is4() && !short(lines):
		return strings.Clone(text)
	case a.Is4(), a.Is4In6():
		return rs.key(a, text)
	}
	var buf [maxIPv6Text]byte
	key := rs.appendKey6(buf[:0], a)
	if slot.claim(text) {
		return slot.remember(text, key)
	}
	return string(key)
}

// appendKey6 appends the key of a, an IPv6 address that is not
// IPv4-mapped: a masked to v6bits, zone dropped.
func (rs *resolver) appendKey6(b []byte, a netip.Addr) []byte {
	p, _ := a.WithZone("").Prefix(rs.v6bits) // bits are checked by WithIPv6Prefix
	return appendIPv6(b, p.Addr())
}

// step is what a walk does with one element of a proxy header.
type step uint8

const (
	stepTrusted   step = iota // a trusted proxy: keep walking left
	stepClient                // the client
	stepMalformed             // not an address: give up on the header
)

// visit classifies one element of a proxy header whose field lines are
// lines; for the client, it returns the key.
func (rs *resolver) visit(elem string, lines []string) (string, step) {
	if rs.hops.has(elem) {
		return "", stepTrusted
	}
	host, f, ok := splitHost(elem)
	if !ok {
		return "", stepMalformed
	}
	var slot *keySlot // only IPv6 clients are remembered
	if f == formV6 {
		s, key, ok := rs.clients.lookup(host)
		if ok {
			return key, stepClient
		}
		slot = s
	}
	a, ok := parseForm(host, f)
	if !ok {
		return "", stepMalformed
	}
	if rs.isTrusted(a) {
		rs.hops.add(elem)
		return "", stepTrusted
	}
	return rs.clientKey(a, host, lines, slot), stepClient
}

// leftmost is the client's key when every element of a proxy header,
// whose field lines are lines, is a trusted proxy: the left-most one, elem
// ("" if there was none).
func (rs *resolver) leftmost(elem string, lines []string) (string, bool) {
	if elem == "" {
		return "", false
	}
	a, text, _ := parseHost(elem) // parsed once already
	return rs.clientKey(a, text, lines, nil), true
}

// walkXFF walks X-Forwarded-For right to left, over every field line (a
// proxy may add a line rather than append to one). Empty list elements are
// skipped, as RFC 9110 asks of recipients.
func (rs *resolver) walkXFF(lines []string) (string, bool) {
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
			key, s := rs.visit(elem, lines)
			switch s {
			case stepClient:
				return key, true
			case stepMalformed:
				return "", false
			}
			last = elem
		}
	}
	return rs.leftmost(last, lines)
}

// walkForwarded walks the for= parameters of Forwarded (RFC 7239) right to
// left. A field line that does not parse is malformed as a whole, since its
// elements cannot be told apart; an element without for=, or whose for= is
// "unknown" or an obfuscated identifier, is malformed when reached.
func (rs *resolver) walkForwarded(lines []string) (string, bool) {
	var (
		last string // the left-most trusted element so far
		buf  [8]string
	)
	for i := len(lines) - 1; i >= 0; i-- {
		fors, ok := forwardedFors(lines[i], buf[:0])
		if !ok {
			return "", false
		}
		for j := len(fors) - 1; j >= 0; j-- {
			key, s := rs.visit(fors[j], lines)
			switch s {
			case stepClient:
				return key, true
			case stepMalformed:
				return "", false
			}
			last = fors[j]
		}
	}
	return rs.leftmost(last, lines)
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

// isBracketed reports whether a RemoteAddr is "[host]:port" (or starts
// as if): the host of an IPv6 peer.
func isBracketed(remote string) bool { return remote != "" && remote[0] == '[' }

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
func parseHost(s string) (netip.Addr, string, bool) {
	host, f, ok := splitHost(s)
	if !ok {
		return netip.Addr{}, "", false
	}
	a, ok := parseForm(host, f)
	if !ok {
		return netip.Addr{}, "", false
	}
	return a, host, true
}

// form is the shape of an address in a proxy header, which says what
// family it must be.
type form uint8

const (
	formAny form = iota // no colon: whatever parses (an IPv4 address)
	formV6              // in brackets, or with two colons or more: IPv6
	formV4              // one colon: an IPv4 address and a port
)

// splitHost takes the brackets and port off an address as parseHost
// accepts it, checking the port, and tells its form by its syntax, before
// anything is parsed: a failed netip.ParseAddr allocates its error, and
// trying the whole string first cost two allocations for every
// "[2001:db8::1]:443" of a Forwarded header.
func splitHost(s string) (string, form, bool) {
	switch i := strings.IndexByte(s, ':'); {
	case s == "":
		return "", 0, false
	case s[0] == '[':
		host := s
		if j := strings.LastIndexByte(s, ':'); j > 0 && s[j-1] == ']' {
			if !isPort(s[j+1:]) {
				return "", 0, false
			}
			host = s[:j]
		}
		if len(host) <= 2 || host[len(host)-1] != ']' {
			return "", 0, false
		}
		return host[1 : len(host)-1], formV6, true
	case i < 0:
		return s, formAny, true
	case i > 0 && i == strings.LastIndexByte(s, ':'):
		// One colon: an IPv4 address and a port (an IPv6 address has two
		// colons at least).
		if !isPort(s[i+1:]) {
			return "", 0, false
		}
		return s[:i], formV4, true
	}
	return s, formV6, true
}

// parseForm parses host, of form f.
func parseForm(host string, f form) (netip.Addr, bool) {
	a, err := netip.ParseAddr(host)
	switch {
	case err != nil, f == formV6 && !a.Is6(), f == formV4 && !a.Is4():
		return netip.Addr{}, false
	}
	return a, true
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
