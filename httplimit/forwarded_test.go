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
