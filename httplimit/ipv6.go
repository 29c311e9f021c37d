package httplimit

import "net/netip"

// maxIPv6Text is the length of the longest IPv6 address text appendIPv6
// writes: eight groups of four hex digits and seven colons.
const maxIPv6Text = 39

// appendIPv6 appends the text of a, an IPv6 address, zone dropped, as
// a.WithZone("").String() spells it unless a is IPv4-mapped (that one it
// writes in hex, where String writes "::ffff:a.b.c.d"): RFC 5952, lower-case
// hex digits without leading zeros, the longest run of two or more zero
// groups (the first of equal ones) written "::". It is netip's formatting
// without its generality: String was half the time of an IPv6 key, and
// FuzzAppendIPv6 holds the two to the same text.
func appendIPv6(b []byte, a netip.Addr) []byte {
	a16 := a.As16()
	var g [8]uint16
	for i := range g {
		g[i] = uint16(a16[2*i])<<8 | uint16(a16[2*i+1])
	}
	if g[4]|g[5]|g[6]|g[7] == 0 {
		// The common key, masked to 64 bits or fewer. The trailing run of
		// zero groups is at least four long, and any other lies within the
		// first three groups: the trailing one is the "::".
		k := 3
		for k >= 0 && g[k] == 0 {
			k--
		}
		for i := 0; i <= k; i++ {
			if i > 0 {
				b = append(b, ':')
			}
			b = appendHex16(b, g[i])
		}
		return append(b, ':', ':')
	}
	// The longest run of zero groups: [zs, zs+zl); zl 0 if none is 2 long.
	zs, zl := 0, 0
	for i := 0; i < len(g); {
		j := i
		for j < len(g) && g[j] == 0 {
			j++
		}
		if j-i >= 2 && j-i > zl {
			zs, zl = i, j-i
		}
		i = j + 1
	}
	for i := 0; i < len(g); i++ {
		switch {
		case zl > 0 && i == zs:
			b = append(b, ':', ':')
			i += zl - 1
			continue
		case i > 0 && !(zl > 0 && i == zs+zl):
			b = append(b, ':')
		}
		b = appendHex16(b, g[i])
	}
	return b
}

// appendHex16 appends v in lower-case hex without leading zeros.
func appendHex16(b []byte, v uint16) []byte {
	const digits = "0123456789abcdef"
	switch {
	case v >= 0x1000:
		return append(b, digits[v>>12], digits[v>>8&0xf], digits[v>>4&0xf], digits[v&0xf])
	case v >= 0x100:
		return append(b, digits[v>>8], digits[v>>4&0xf], digits[v&0xf])
	case v >= 0x10:
		return append(b, digits[v>>4], digits[v&0xf])
	}
	return append(b, digits[v])
}
