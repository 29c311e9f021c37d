package httplimit

import (
	"strings"
	"testing"
)

// TestIsTchar checks the token table against RFC 9110's definition, byte
// by byte.
func TestIsTchar(t *testing.T) {
	for c := range 256 {
		b := byte(c)
		want := 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
		if got := isTchar(b); got != want {
			t.Errorf("isTchar(%q) = %v, want %v", b, got, want)
		}
	}
}

// TestIsQdtext checks the qdtext table against RFC 9110's definition.
func TestIsQdtext(t *testing.T) {
	for c := range 256 {
		b := byte(c)
		want := b == '\t' || b == ' ' || b == 0x21 || 0x23 <= b && b <= 0x5b || 0x5d <= b && b <= 0x7e || b >= 0x80
		if got := isQdtext(b); got != want {
			t.Errorf("isQdtext(%q) = %v, want %v", b, got, want)
		}
	}
}

// refQuotedString is RFC 9110's quoted-string, byte by byte.
func refQuotedString(line string, i int) (string, int, bool) {
	var b strings.Builder
	for j := i + 1; j < len(line); j++ {
		c := line[j]
		switch {
		case c == '"':
			return b.String(), j + 1, true
		case c == '\\':
			j++
			if j >= len(line) || !(line[j] == '\t' || 0x20 <= line[j] && line[j] <= 0x7e || line[j] >= 0x80) {
				return "", i, false
			}
			b.WriteByte(line[j])
		case c == '\t' || c == ' ' || c == 0x21 || 0x23 <= c && c <= 0x5b || 0x5d <= c && c <= 0x7e || c >= 0x80:
			b.WriteByte(c)
		default:
			return "", i, false
		}
	}
	return "", i, false
}

// FuzzQuotedString holds quotedString, with its fast path for values
// without a quoted-pair, to refQuotedString.
func FuzzQuotedString(f *testing.F) {
	for _, s := range []string{`"[2001:db8::1]:4711", for=x`, `"a\"b"`, `"a\\"`, `"open`, "\"a\x01b\"", `"\`, `""`,
		"\"tab\there\"", "\"del\x7f\"", `"x" "y"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		if !strings.HasPrefix(line, `"`) {
			line = `"` + line
		}
		got, gotNext, gotOK := quotedString(line, 0)
		want, wantNext, wantOK := refQuotedString(line, 0)
		if got != want || gotNext != wantNext || gotOK != wantOK {
			t.Fatalf("quotedString(%q) = %q, %d, %v; want %q, %d, %v", line, got, gotNext, gotOK, want, wantNext, wantOK)
		}
	})
}

// BenchmarkForwardedFors parses the Forwarded lines of the overhead
// benchmarks.
func BenchmarkForwardedFors(b *testing.B) {
	for _, tc := range []struct{ name, line string }{
		{"ipv4", "for=198.51.100.7;proto=https, for=10.0.0.2"},
		{"ipv6", `for="[2001:db8:1:2:3:4:5:6]:4711", for="[2001:db8:ffff::2]"`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var buf [8]string
			for b.Loop() {
				if fors, ok := forwardedFors(tc.line, buf[:0]); !ok || len(fors) != 2 {
					b.Fatalf("forwardedFors(%q) = %q, %v", tc.line, fors, ok)
				}
			}
		})
	}
}
