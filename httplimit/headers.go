package httplimit

import (
	"encoding/base64"
	"net/http"
	"strconv"
)

// Header keys in canonical form, written straight into the header map:
// Header.Set would copy "RateLimit" to "Ratelimit" on every request. Names
// are case-insensitive on the wire.
const (
	hPolicy     = "Ratelimit-Policy"
	hRateLimit  = "Ratelimit"
	hRetryAfter = "Retry-After"
	hXLimit     = "X-Ratelimit-Limit"
	hXRemaining = "X-Ratelimit-Remaining"
	hXReset     = "X-Ratelimit-Reset"
)

// maxSFInt is the largest structured-field Integer (RFC 9651, 3.3.1).
const maxSFInt = 999_999_999_999_999

// setHeaders writes the fields for outs, the legacy ones too if legacy.
// The values are formatted into one buffer and become substrings of one
// string, and the header slices share one array: two allocations,
// whatever the number of fields.
func setHeaders(h http.Header, outs []outcome, refused, legacy bool) {
	var (
		stack [384]byte // enough for the fields of two limiters with partition keys; more spill to the heap
		keys  [6]string
		ends  [6]int
		k     int
	)
	buf := stack[:0]
	mark := func(key string) {
		keys[k], ends[k] = key, len(buf)
		k++
	}

	for i := range outs {
		if validLimit(outs[i].res.Limit) {
			if len(buf) > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicy(buf, &outs[i])
		}
	}
	if len(buf) > 0 {
		mark(hPolicy)
	}

	// One item per quota unit: remaining requests and remaining bytes do
	// not compare.
	from := len(buf)
	for i := range outs {
		if unitSeen(outs[:i], outs[i].rule.unit) {
			continue
		}
		if len(buf) > from {
			buf = append(buf, ", "...)
		}
		buf = appendServiceLimit(buf, mostRestrictive(outs[i:], outs[i].rule.unit))
	}
	mark(hRateLimit)

	win := mostRestrictive(outs, "")
	res := win.res
	if refused && !win.never {
		buf = strconv.AppendInt(buf, seconds(res.RetryAfter), 10)
		mark(hRetryAfter)
	}
	if legacy {
		if validLimit(res.Limit) {
			buf = strconv.AppendInt(buf, res.Limit.Capacity(), 10)
			mark(hXLimit)
		}
		buf = strconv.AppendInt(buf, max(res.Remaining, 0), 10)
		mark(hXRemaining)
		buf = strconv.AppendInt(buf, seconds(res.ResetAfter), 10)
		mark(hXReset)
	}

	s := string(buf)
	vals := make([]string, k)
	start := 0
	for i := range k {
		vals[i] = s[start:ends[i]]
		h[keys[i]] = vals[i : i+1 : i+1]
		start = ends[i]
	}
}

// unitSeen reports whether one of outs counts in unit.
func unitSeen(outs []outcome, unit string) bool {
	for i := range outs {
		if outs[i].rule.unit == unit {
			return true
		}
	}
	return false
}

// mostRestrictive returns the outcome, among outs of unit (of any unit if
// unit is ""), that restricts the client most: a denial over an
// admission; among denials, one that can never pass, else the longest
// RetryAfter; among admissions of one unit, the fewest units left. Ties,
// and admissions of different units, go to the earlier limiter. At least
// one of outs must count in unit.
func mostRestrictive(outs []outcome, unit string) *outcome {
	var w *outcome
	for i := range outs {
		o := &outs[i]
		if unit != "" && o.rule.unit != unit {
			continue
		}
		if w == nil || o.worse(w) {
			w = o
		}
	}
	return w
}

func (o *outcome) denied() bool { return o.never || !o.res.Allowed }

// worse reports whether o restricts the client more than p.
func (o *outcome) worse(p *outcome) bool {
	switch {
	case o.denied() != p.denied():
		return o.denied()
	case !o.denied():
		return o.rule.unit == p.rule.unit && o.res.Remaining < p.res.Remaining
	case o.never != p.never:
		return o.never
	}
	return o.res.RetryAfter > p.res.RetryAfter
}

// appendPolicy appends o's quota policy item (draft §3.1):
// "name:quota";q=Q;qu="unit";w=W;pk=:key:, qu only for a unit other than
// requests, pk only with WithPartitionKey.
func appendPolicy(buf []byte, o *outcome) []byte {
	l := o.res.Limit
	q, w := quota(l)
	buf = o.rule.names.appendName(buf, o.rule, l)
	buf = append(buf, ";q="...)
	buf = appendSFInt(buf, q)
	if u := o.rule.unit; u != UnitRequests {
		buf = append(buf, `;qu="`...)
		buf = append(buf, u...)
		buf = append(buf, '"')
	}
	buf = append(buf, ";w="...)
	buf = appendSFInt(buf, w)
	if c := l.Capacity(); c > q {
		buf = append(buf, ";"+burstParam+"="...)
		buf = appendSFInt(buf, c)
	}
	return appendPK(buf, o)
}

// burstParam is the quota policy parameter that advertises a burst above
// q: the draft (§3.1) allows parameters of its own and asks that they be
// prefixed with the implementation's name.
const burstParam = "tierlimit-burst"

// appendServiceLimit appends o's service limit item (draft §4.1):
// "name:quota";r=R;t=T;pk=:key:, t only for a request that can be
// admitted. r is at most the policy's q: a bucket whose burst is above
// its rate holds more than q, which its policy tells (burstParam), and a
// client pacing itself by r and t stays within the quota it was told.
func appendServiceLimit(buf []byte, o *outcome) []byte {
	buf = o.rule.names.appendName(buf, o.rule, o.res.Limit)
	buf = append(buf, ";r="...)
	r := o.res.Remaining
	if validLimit(o.res.Limit) {
		q, _ := quota(o.res.Limit)
		r = min(r, q)
	}
	buf = appendSFInt(buf, r)
	if !o.never {
		buf = append(buf, ";t="...)
		buf = appendSFInt(buf, seconds(effectiveWindow(o.res)))
	}
	return appendPK(buf, o)
}

// appendPK appends o's pk parameter, a structured-field Byte Sequence, if
// its limiter has partition keys.
func appendPK(buf []byte, o *outcome) []byte {
	if o.rule.pk == nil {
		return buf
	}
	buf = append(buf, ";pk=:"...)
	buf = base64.StdEncoding.AppendEncode(buf, o.pk[:])
	return append(buf, ':')
}

// appendSFInt appends a structured-field Integer, clamped to its range
// (and to 0 from below: every parameter here is non-negative).
func appendSFInt(buf []byte, v int64) []byte {
	return strconv.AppendInt(buf, min(max(v, 0), maxSFInt), 10)
}

// appendSFString appends a structured-field String. s is printable ASCII
// (checkPolicy).
func appendSFString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			buf = append(buf, '\\')
		}
		buf = append(buf, s[i])
	}
	return append(buf, '"')
}
