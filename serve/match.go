package serve

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Entry is one key and value of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Match returns the rule for a descriptor of domain, as envoyproxy/ratelimit
// matches: the entries walk down the domain's tree, each to the child
// configured with its key and value, else to one whose value pattern ('*'
// matches any run of characters) holds it, else to the one with its key and
// no value (any value; each value is then counted apart). The rule applies
// only when the walk reaches the last entry on a node with a rate_limit: a
// descriptor longer or shorter than the configured path has no rule. It
// returns nil for no rule or an unknown domain.
func (c *Config) Match(domain string, entries []Entry) *Rule {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil
	}
	for _, e := range entries {
		n = n.child(e)
		if n == nil {
			return nil
		}
	}
	return n.rule
}

func (n *node) child(e Entry) *node {
	if c := n.exact[e.Key][e.Value]; c != nil {
		return c
	}
	for _, g := range n.globs {
		if g.key == e.Key && globMatch(g.parts, e.Value) {
			return g.node
		}
	}
	return n.any[e.Key]
}

// globMatch reports whether s matches the pattern whose literal parts,
// split on '*', are parts (at least two of them).
func globMatch(parts []string, s string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// override is a limit a request's descriptor carries in place of the
// configured one (RateLimitDescriptor.limit).
type override struct {
	RequestsPerUnit uint32
	Unit            Unit
}

// The limiter key of a descriptor is its domain and entries (and override,
// if any), each escaped and separated by '|': one bucket per distinct
// descriptor, as envoyproxy/ratelimit keys its counters by the request's
// values. Escaping makes the encoding one-to-one, so that the limit of a
// key is found again from the key alone, by matching it.
const (
	sepEntry     = '|'
	sepValue     = '='
	markOverride = '!'
	escape       = '\\'
)

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case sepEntry, sepValue, markOverride, escape:
			b = append(b, escape, c)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendKey appends the limiter key of a descriptor to b.
func appendKey(b []byte, domain string, entries []Entry, o *override) []byte {
	b = appendEscaped(b, domain)
	for _, e := range entries {
		b = append(b, sepEntry)
		b = appendEscaped(b, e.Key)
		b = append(b, sepValue)
		b = appendEscaped(b, e.Value)
	}
	if o != nil {
		b = append(b, sepEntry)
		b = appendOverride(b, o)
	}
	return b
}

func appendOverride(b []byte, o *override) []byte {
	b = append(b, markOverride)
	b = strconv.AppendUint(b, uint64(o.RequestsPerUnit), 10)
	b = append(b, '/')
	return append(b, o.Unit...)
}

// parseOverride is appendOverride's inverse, without the mark.
func parseOverride(s string) (*override, bool) {
	rpu, unit, found := strings.Cut(s, "/")
	n, err := strconv.ParseUint(rpu, 10, 32)
	if !found || err != nil {
		return nil, false
	}
	if _, known := unitPeriods[Unit(unit)]; !known {
		return nil, false
	}
	return &override{RequestsPerUnit: uint32(n), Unit: Unit(unit)}, true
}

// markLong starts the key of a descriptor whose key would be longer than
// the limiters take (tierlimit.MaxKeyLen, long header values): an escape
// appendKey never writes, then the SHA-256 of the full key, then the
// rule's id or the override, so that the limit is still found from the key
// alone, as a reference server keys such descriptors like any other.
const markLong = "\\#"

// longKey returns the key of a descriptor whose full key is too long.
func longKey(full []byte, r *Rule, o *override) string {
	sum := sha256.Sum256(full)
	b := make([]byte, 0, len(markLong)+2*len(sum)+1+len(r.id))
	b = append(b, markLong...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, sepEntry)
	if o != nil {
		b = appendOverride(b, o)
	} else {
		b = append(b, r.id...)
	}
	return string(b)
}

// parseLongKey is longKey's inverse: the rule's id or the override; ok is
// false for a key longKey did not make.
func parseLongKey(key string) (id string, o *override, ok bool) {
	rest, found := strings.CutPrefix(key, markLong)
	if !found || len(rest) <= 2*sha256.Size || rest[2*sha256.Size] != sepEntry {
		return "", nil, false
	}
	tail := rest[2*sha256.Size+1:]
	if t, isOverride := strings.CutPrefix(tail, string(markOverride)); isOverride {
		o, ok = parseOverride(t)
		return "", o, ok
	}
	return tail, nil, tail != ""
}

// parseKey is appendKey's inverse; ok is false for a string appendKey
// cannot have made.
func parseKey(key string) (domain string, entries []Entry, o *override, ok bool) {
	fields, ok := splitKey(key)
	if !ok || len(fields) == 0 || fields[0].text == "" {
		return "", nil, nil, false
	}
	domain = fields[0].text
	for _, f := range fields[1:] {
		switch {
		case f.override:
			if o != nil {
				return "", nil, nil, false
			}
			if o, ok = parseOverride(f.text); !ok {
				return "", nil, nil, false
			}
		case o != nil || !f.hasValue:
			return "", nil, nil, false
		default:
			entries = append(entries, Entry{Key: f.text, Value: f.value})
		}
	}
	return domain, entries, o, true
}

type keyField struct {
	text, value string
	hasValue    bool
	override    bool
	inValue     bool
}

func splitKey(key string) ([]keyField, bool) {
	var fields []keyField
	var cur keyField
	var buf []byte
	flush := func() {
		if cur.inValue {
			cur.value = string(buf)
		} else {
			cur.text = string(buf)
		}
		fields = append(fields, cur)
		cur, buf = keyField{}, buf[:0]
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == escape:
			if i+1 == len(key) {
				return nil, false
			}
			i++
			buf = append(buf, key[i])
		case c == sepEntry:
			flush()
		case c == sepValue && !cur.inValue && !cur.override && len(fields) > 0:
			cur.text, cur.inValue, cur.hasValue = string(buf), true, true
			buf = buf[:0]
		case c == markOverride && len(buf) == 0 && !cur.inValue && len(fields) > 0:
			cur.override = true
		default:
			if c == sepValue || c == markOverride {
				return nil, false
			}
			buf = append(buf, c)
		}
	}
	flush()
	return fields, true
}
