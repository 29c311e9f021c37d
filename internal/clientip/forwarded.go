package clientip

import "strings"

// ForwardedFor returns the value of the for parameter of one element of a
// Forwarded field line (RFC 7239, section 4), cut at its commas:
//
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// Optional whitespace is accepted around ';'. ok is false when the element
// does not parse, or names for twice or not at all.
func ForwardedFor(elem string) (val string, ok bool) {
	found := false
	for s := elem; ; {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return val, found
		}
		if s[0] == ';' {
			s = s[1:]
			continue
		}
		name, v, rest, ok := forwardedPair(s)
		if !ok {
			return "", false
		}
		if strings.EqualFold(name, "for") {
			if found {
				return "", false
			}
			val, found = v, true
		}
		s = strings.TrimLeft(rest, " \t")
		if s != "" && s[0] != ';' {
			return "", false
		}
	}
}

// forwardedPair parses token "=" value at the start of s and returns what
// follows it.
func forwardedPair(s string) (name, val, rest string, ok bool) {
	n := tokenLen(s)
	if n == 0 || n == len(s) || s[n] != '=' {
		return "", "", "", false
	}
	name, s = s[:n], s[n+1:]
	if strings.HasPrefix(s, `"`) {
		val, rest, ok = unquote(s)
		return name, val, rest, ok
	}
	n = tokenLen(s)
	return name, s[:n], s[n:], n > 0
}

// tokenLen returns the length of the token (RFC 9110, section 5.6.2) at
// the start of s.
func tokenLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return i
		}
	}
	return len(s)
}

// unquote parses the quoted-string (RFC 9110, section 5.6.4) at the start
// of s, a '"', and returns its content unescaped and what follows it.
func unquote(s string) (val, rest string, ok bool) {
	escaped := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			val = s[1:i]
			if escaped {
				val = unescape(val)
			}
			return val, s[i+1:], true
		case c == '\\':
			// quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
			if i++; i == len(s) || s[i] < 0x20 && s[i] != '\t' || s[i] == 0x7f {
				return "", "", false
			}
			escaped = true
		case c < 0x20 && c != '\t', c == 0x7f:
			return "", "", false // not qdtext
		}
	}
	return "", "", false
}

// unescape removes the backslashes of quoted-pairs from a checked
// quoted-string's content.
func unescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
