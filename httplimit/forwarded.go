package httplimit

import "strings"

// forwardedFors parses one Forwarded field line (RFC 7239, section 4):
//
//	Forwarded         = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// and appends to fors, for each element in order, the value of its for
// parameter ("" when it has none). Empty elements are skipped; optional
// whitespace is accepted around ',' and ';'. ok is false when the line does
// not parse, or an element names for twice.
func forwardedFors(line string, fors []string) (_ []string, ok bool) {
	i := 0
	for {
		forVal, pairs := "", 0
		hasFor := false
		for {
			i = skipOWS(line, i)
			if i >= len(line) || line[i] == ',' {
				break
			}
			if line[i] == ';' {
				i++
				continue
			}
			var name, val string
			name, val, i, ok = forwardedPair(line, i)
			if !ok {
				return fors, false
			}
			pairs++
			if isFor(name) {
				if hasFor {
					return fors, false
				}
				forVal, hasFor = val, true
			}
			i = skipOWS(line, i)
			if i < len(line) && line[i] != ';' && line[i] != ',' {
				return fors, false
			}
		}
		if pairs > 0 {
			fors = append(fors, forVal)
		}
		if i >= len(line) {
			return fors, true
		}
		i++ // the ','
	}
}

// forwardedPair parses token "=" value at line[i:].
func forwardedPair(line string, i int) (name, val string, next int, ok bool) {
	j := i
	for j < len(line) && isTchar(line[j]) {
		j++
	}
	if j == i || j >= len(line) || line[j] != '=' {
		return "", "", i, false
	}
	name, i = line[i:j], j+1
	if i < len(line) && line[i] == '"' {
		val, i, ok = quotedString(line, i)
		return name, val, i, ok
	}
	j = i
	for j < len(line) && isTchar(line[j]) {
		j++
	}
	if j == i {
		return "", "", i, false
	}
	return name, line[i:j], j, true
}

// quotedString parses the quoted-string (RFC 9110, section 5.6.4) that
// starts at line[i], a '"'. It returns the unescaped content and the index
// after the closing quote.
func quotedString(line string, i int) (string, int, bool) {
	// Most values, an IPv6 address in brackets, have no quoted-pair: find
	// the closing quote at once and check the bytes before it.
	if n := strings.IndexByte(line[i+1:], '"'); n >= 0 {
		if s := line[i+1 : i+1+n]; allQdtext(s) {
			return s, i + n + 2, true
		}
	}
	escaped := false
	for j := i + 1; j < len(line); j++ {
		c := line[j]
		if isQdtext(c) {
			continue
		}
		switch {
		case c == '"':
			s := line[i+1 : j]
			if escaped {
				s = unescape(s)
			}
			return s, j + 1, true
		case c == '\\':
			j++
			if j >= len(line) || !isQuotedPairChar(line[j]) {
				return "", i, false
			}
			escaped = true
		default:
			return "", i, false
		}
	}
	return "", i, false
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

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTchar reports whether c may appear in a token (RFC 9110, section 5.6.2).
func isTchar(c byte) bool { return tchars[c] }

// tchars is the set of token bytes, as a table: every byte of a Forwarded
// line's names and values goes through isTchar, and searching the list of
// punctuation for each was a fifth of the middleware's time with that header.
var tchars = func() (t [256]bool) {
	for c := range t {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
	}
	for _, c := range []byte("!#$%&'*+-.^_`|~") {
		t[c] = true
	}
	return t
}()

// isQdtext reports whether c may appear unescaped in a quoted-string.
func isQdtext(c byte) bool { return qdtext[c] }

// qdtext is the set of qdtext bytes, as a table, like tchars: an IPv6
// for= is quoted, and this table (with the length check before EqualFold)
// took a quarter off the parser's time for a line of two such elements.
var qdtext = func() (t [256]bool) {
	for c := range t {
		t[c] = c == '\t' || c == ' ' || c == 0x21 || 0x23 <= c && c <= 0x5b || 0x5d <= c && c <= 0x7e || c >= 0x80
	}
	return t
}()

// allQdtext reports whether every byte of s is qdtext.
func allQdtext(s string) bool {
	for i := 0; i < len(s); i++ {
		if !qdtext[s[i]] {
			return false
		}
	}
	return true
}

// isQuotedPairChar reports whether c may follow a backslash.
func isQuotedPairChar(c byte) bool {
	return c == '\t' || (0x20 <= c && c <= 0x7e) || c >= 0x80
}

// isFor reports whether a parameter name is "for", in any case. It is
// strings.EqualFold unrolled: that call was a tenth of the parser's time.
func isFor(name string) bool {
	return len(name) == 3 && name[0]|0x20 == 'f' && name[1]|0x20 == 'o' && name[2]|0x20 == 'r'
}
