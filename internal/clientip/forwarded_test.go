package clientip

import "testing"

// TestForwardedFor checks the parse of one Forwarded element against RFC
// 7239's grammar, with RFC 9110's tokens and quoted-strings.
func TestForwardedFor(t *testing.T) {
	for _, tc := range []struct {
		elem string
		want string
		ok   bool
	}{
		{"for=192.0.2.1", "192.0.2.1", true},
		{" For=192.0.2.1 ", "192.0.2.1", true},
		{"FOR=192.0.2.1;proto=https;by=10.0.0.1", "192.0.2.1", true},
		{"proto=https ; for=192.0.2.1 ;", "192.0.2.1", true},
		{";;for=192.0.2.1;;", "192.0.2.1", true},
		{`for="[2001:db8::1]:4711"`, "[2001:db8::1]:4711", true},
		{`for="192.0.2.\1"`, "192.0.2.1", true},
		{`for="a\"b\\c"`, `a"b\c`, true},
		{"for=\"tab\there\"", "tab\there", true},
		{"for=\"obs\x80text\"", "obs\x80text", true},
		{`for=""`, "", true},
		{"for=unknown", "unknown", true},
		{"for=_hidden", "_hidden", true},
		{"proto=https", "", false},                            // no for
		{"for=192.0.2.1;for=192.0.2.2", "", false},            // for twice
		{"for=[2001:db8::1]", "", false},                      // '[' is not a token
		{"for = 192.0.2.1", "", false},                        // no whitespace around '='
		{"for=", "", false},                                   // no value
		{"=192.0.2.1", "", false},                             // no name
		{"for", "", false},                                    // no '='
		{"for=192.0.2.1 proto=https", "", false},              // no ';' between pairs
		{`for="192.0.2.1`, "", false},                         // unterminated
		{`for="192.0.2.1\`, "", false},                        // quoted-pair cut off
		{`for="192.0.2.1"x`, "", false},                       // text after the quote
		{"for=\"a\x01b\"", "", false},                         // a control in a quoted-string
		{"for=\"a\x7f\"", "", false},                          // DEL in a quoted-string
		{"for=\"a\\\x01\"", "", false},                        // a control in a quoted-pair
		{"for=192.0.2.1;proto=\"https", "", false},            // another value unterminated
		{`for=192.0.2.1;"proto"=https`, "", false},            // a quoted name
		{"for=192.0.2.1;pro to=https", "", false},             // a space in a name
		{"for=192.0.2.1;proto=ht\"tps\"", "", false},          // a quote in a token
		{"for=192.0.2.1;proto=https;=", "", false},            // an empty pair
		{"for=192.0.2.1\x00", "", false},                      // NUL after the value
		{"host=example.com;for=192.0.2.1", "192.0.2.1", true}, // for anywhere
	} {
		got, ok := ForwardedFor(tc.elem)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ForwardedFor(%q) = %q, %v; want %q, %v", tc.elem, got, ok, tc.want, tc.ok)
		}
	}
}
